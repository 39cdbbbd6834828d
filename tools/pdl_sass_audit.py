"""Audit of the CUDA objects' SASS for loads that run before a kernel's grid-dependency wait.

A kernel launched with programmatic dependent launch may start while the previous kernel still
writes; griddepcontrol.wait (SASS ACQBULK) is where it may first read that kernel's output.
ptxas may move a non-coherent load (ld.global.nc: __ldg, or a const __restrict__ pointer;
SASS LDG...CONSTANT) above the wait, since such a load promises memory that does not change
while the kernel runs. So per kernel that waits, this lists the global loads placed before its
first ACQBULK: weights may be there (they never change; the GEMVs stream them early on
purpose), activations may not. Loads marked .NA (L1::no_allocate) are the weight streams and
are not listed. Expected in the list (2026-12-03): NVFP4 group scales (LDG.E.U16.CONSTANT) in
the general quantized GEMV, the delta rule's GdnSeq metadata (uploaded by a copy before the
step's kernels); any activation here is a race. Activations read with load_activations4()
(kernels_common.cuh) stay below the wait.

    python3 tools/pdl_sass_audit.py build/<dir>/CMakeFiles/ninfer_cuda.dir/native/backends/cuda/*.o
    (needs cuobjdump on PATH)
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

FUNCTION = re.compile(r"^\s*Function : (\S+)")
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def audit(path: str) -> list[tuple[str, Counter]]:
    run = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True)
    if run.returncode != 0:  # e.g. an object without device code
        return []
    sass = run.stdout
    found = []
    name, before, waited = None, Counter(), False

    def flush() -> None:
        if name and waited and before:
            found.append((name, before.copy()))

    for line in sass.splitlines():
        m = FUNCTION.match(line)
        if m:
            flush()
            name, before, waited = m.group(1), Counter(), False
            continue
        m = INSTRUCTION.search(line)
        if not m or name is None:
            continue
        op = m.group(3)
        if op == "ACQBULK":
            waited = True
        elif not waited and op.startswith("LDG") and ".NA" not in op:
            before[op] += 1
    flush()
    return found


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    total = 0
    for path in sys.argv[1:]:
        for name, loads in audit(path):
            total += 1
            demangled = subprocess.run(["c++filt", name], capture_output=True, text=True)
            print(f"{path.rsplit('/', 1)[-1]}: {demangled.stdout.strip()[:160]}")
            listed = ", ".join(f"{op} ×{n}" for op, n in sorted(loads.items()))
            print(f"    before the wait: {listed}")
    print(f"{total} waiting kernels load something other than weight streams before their wait")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Reads `cuobjdump -sass` of the device kernels and says, per kernel, how many 16-byte global
loads (LDG.E.128) a thread has in flight in its bulk moves, and whether it touches local memory.

Loads in flight: for each LDG.E.128, the number of LDG.E.128 issued from it up to the first
instruction that reads a register it loaded (itself included); a kernel's figure is the largest.
A move that loads kPacksInFlight packs of each of its two sources before it reduces the first
shows 2 x kPacksInFlight; one that reduces each pack as it arrives shows 2.

    python3 sass_loads.py --sass SASS --ptxas PTXAS_V --min-loads N --max-registers M [--bulk RE]

exits 1, naming them, where a kernel whose (mangled) name matches RE (default: the Simple and
segmented ring kernels and the direct kernels) has fewer loads in flight than N, or any kernel has an LDL/STL (local memory:
spills or stack arrays) or more than M registers per thread (ptxas -v).
"""

import argparse
import re
import sys

INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
REGISTER = re.compile(r"\bR(\d+)\b")
STORES = ("ST", "STG", "STS", "STL", "RED", "ATOM", "ATOMG")


def functions(text):
    """{name: [instruction text, ...]} in program order."""
    found, name = {}, None
    for line in text.splitlines():
        header = re.match(r"\s*Function : (\S+)", line)
        if header:
            name = header.group(1)
            found[name] = []
        elif name is not None:
            match = INSTRUCTION.search(line)
            if match:
                found[name].append(match.group(1))
    return found


def split(instruction):
    """(opcode, [operands]) without a predicate guard."""
    instruction = re.sub(r"^@!?U?P[T0-9]+\s+", "", instruction)
    opcode, _, rest = instruction.partition(" ")
    return opcode, [o.strip() for o in rest.split(",")] if rest else []


def registers(operand, wide):
    """The registers an operand names; a 128-bit register operand names four."""
    named = set()
    for number in REGISTER.findall(operand):
        first = int(number)
        named.update(range(first, first + (4 if wide else 1)))
    return named


def reads(opcode, operands):
    """The registers an instruction reads: every operand of a store, the others' but the first."""
    wide = ".128" in opcode
    sources = operands if opcode.split(".")[0] in STORES else operands[1:]
    named = set()
    for operand in sources:
        # An address operand [R2.64] reads a register pair.
        pair = "[" in operand and ".64" in operand
        for r in registers(operand, wide and "[" not in operand):
            named.update({r, r + 1} if pair else {r})
    return named


def loads_in_flight(instructions):
    decoded = [split(i) for i in instructions]
    most = 0
    for at, (opcode, operands) in enumerate(decoded):
        if not opcode.startswith("LDG.E.128") or not operands:
            continue
        loaded = registers(operands[0], True)
        issued = 1
        for later_opcode, later_operands in decoded[at + 1:]:
            if loaded & reads(later_opcode, later_operands):
                break
            if later_opcode.startswith("LDG.E.128"):
                issued += 1
        most = max(most, issued)
    return most


def registers_used(ptxas_text):
    """{kernel: registers per thread} from `ptxas -v`."""
    used, name = {}, None
    for line in ptxas_text.splitlines():
        entry = re.search(r"Compiling entry function '([^']+)'", line)
        if entry:
            name = entry.group(1)
        count = re.search(r"Used (\d+) registers", line)
        if count and name is not None:
            used[name] = int(count.group(1))
            name = None
    return used


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sass", required=True, help="cuobjdump -sass of the kernels' object")
    parser.add_argument("--ptxas", required=True, help="ptxas -v's output for the same object")
    parser.add_argument("--min-loads", type=int, required=True)
    parser.add_argument("--max-registers", type=int, required=True)
    parser.add_argument("--bulk", default=r"ringKernel.*(FifoViewPorts|SegmentPorts)|directKernel",
                        help="the kernels whose moves are bulk (regex): the loads are counted there")
    args = parser.parse_args()
    with open(args.sass) as f:
        found = functions(f.read())
    with open(args.ptxas) as f:
        used = registers_used(f.read())
    bulk = re.compile(args.bulk)
    failed, loads, with_local, most_registers = [], [], 0, 0
    for name, instructions in found.items():
        problems = []
        if bulk.search(name):
            loads.append(loads_in_flight(instructions))
            if loads[-1] < args.min_loads:
                problems.append(f"{loads[-1]} loads in flight")
        local = sum(1 for i in instructions if re.match(r"(@!?P\w+\s+)?(LDL|STL)\b", i))
        with_local += local > 0
        if local:
            problems.append(f"{local} local-memory accesses")
        registers = used.get(name)
        most_registers = max(most_registers, registers or 0)
        if registers is None or registers > args.max_registers:
            problems.append(f"{registers} registers")
        if problems:
            failed.append(f"{name}: " + ", ".join(problems))
    print(f"{len(found)} kernels: local memory in {with_local}; registers at most {most_registers} "
          f"(allowed {args.max_registers}); {len(loads)} bulk kernels: 16-byte loads in flight "
          f"before the first is used at least {min(loads, default=0)} (required {args.min_loads})")
    if not loads:
        print("FAIL: no bulk kernel matched", args.bulk)
        return 1
    for line in failed:
        print("FAIL:", line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

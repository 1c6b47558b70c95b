"""How close each generic kernel of a profiled step runs to the memory's rate.

    python3 bench/kernel_traffic.py PROFILE REPORT [--copy-rate TB/s] [--top N]

PROFILE is the output of bench/profile_layer.py or bench/profile_train.py
(its first table: ms a step, calls a step, kernel name); REPORT the remarks
of `moe-compile ... --traffic-report` for the same artifact (`generic kernel
NAME: reads R bytes, writes W bytes`). For every kernel in both: its bytes a
call, its rate (bytes x calls / time) and that rate against --copy-rate
(default 4.27 TB/s, the H200's measured copy rate; about 3.0 on an H100),
sorted by the time above what the copy rate allows. The bytes count each
buffer whole and once: a kernel that reads part of a buffer shows a rate
above its real one, a gather that reads rows several times one below.
"""
import argparse
import re
import sys

ROW = re.compile(r"^\s*([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\S+)\s*$")
REMARK = re.compile(
    r"generic kernel (\S+): reads (\d+|\?) bytes, writes (\d+|\?) bytes")


def profile_table(lines):
    """{kernel: (ms a step, calls a step)} from the profile's first table."""
    table = {}
    for line in lines:
        if "by launch position" in line:
            break
        m = ROW.match(line)
        if m and m.group(4) not in table:
            table[m.group(4)] = (float(m.group(1)), int(m.group(3)))
    return table


def traffic(lines):
    """{kernel: bytes a call (read + written)}; kernels with a size the
    report could not tell (`?`) are left out."""
    out = {}
    for line in lines:
        m = REMARK.search(line)
        if m and "?" not in (m.group(2), m.group(3)):
            out[m.group(1)] = int(m.group(2)) + int(m.group(3))
    return out


def main(argv):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", help="bench/profile_layer.py or profile_train.py output")
    parser.add_argument("report", help="moe-compile --traffic-report remarks")
    parser.add_argument("--copy-rate", type=float, default=4.27,
                        help="memory copy rate in TB/s (default 4.27, H200)")
    parser.add_argument("--top", type=int, default=40,
                        help="kernels listed (default 40)")
    args = parser.parse_args(argv)
    if args.copy_rate <= 0:
        parser.error("--copy-rate must be positive")
    try:
        with open(args.profile) as f:
            table = profile_table(f)
        with open(args.report) as f:
            sizes = traffic(f)
    except OSError as e:
        print(f"kernel_traffic.py: {e}", file=sys.stderr)
        return 1
    rows = []
    for name, (ms, calls) in table.items():
        if name in sizes and ms > 0 and calls > 0:
            floor = sizes[name] * calls / (args.copy_rate * 1e12) * 1e3
            rows.append((ms - floor, ms, calls, sizes[name], name))
    if not rows:
        print("kernel_traffic.py: no kernel is in both the profile and the report "
              "(the same artifact's?)", file=sys.stderr)
        return 1
    rows.sort(reverse=True)
    print(f"{'ms/step':>9} {'calls':>6} {'MB/call':>9} {'TB/s':>6} {'copy%':>6} "
          f"{'over':>8}  kernel   (copy rate {args.copy_rate:g} TB/s)")
    for over, ms, calls, size, name in rows[:args.top]:
        rate = size * calls / (ms * 1e-3) / 1e12
        print(f"{ms:9.3f} {calls:6d} {size / 1e6:9.1f} {rate:6.2f} "
              f"{100 * rate / args.copy_rate:5.0f}% {over:8.3f}  {name}")
    total = sum(r[1] for r in rows)
    floor = sum(r[1] - r[0] for r in rows)
    print(f"{total:9.3f} ms in {len(rows)} generic kernels, {floor:.3f} ms at the copy rate")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

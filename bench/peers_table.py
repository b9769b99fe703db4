#!/usr/bin/python3
"""Helpers for bench/peers.sh (not meant to be run by hand):

  peers_table.py pids tag TAG NAME...      pids of processes named NAME (comm) whose
                                           environment holds SPILLWAY_RUN_TAG=TAG
  peers_table.py pids cmd TEXT NAME...     pids of processes named NAME whose command
                                           line contains TEXT
  peers_table.py ticks PID...              utime + stime (clock ticks, all threads) summed
  peers_table.py strace-counts FILE        "TOTAL (fsync a, fdatasync b, ...)" from strace -c
  peers_table.py seaweed-nodes URL         number of volume servers the master knows
  peers_table.py table RESULTS [TSV]       the comparison table (and the same as TSV)

RESULTS lines (tab-separated):
  meta KEY VALUE            printed in the header (commit, date, kernel, ...)
  system NAME               a system measured, in column order
  down NAME REASON          the system could not be brought up (its column says n/a)
  fsync NAME TEXT           the storage syncs the system made for 20 application fsyncs
  note TEXT                 printed under the table
  result REP FIGURE SYSTEM VALUE   one measurement ("n/a (reason)" when it failed)
"""
import json
import os
import statistics
import sys
import urllib.request

# The /proc readers of the project's process sweep (scripts/lib/sweep.py), shared.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts", "lib"))
from sweep import cmdline, environ_has, is_zombie  # noqa: E402

PEERS = ("glusterfs", "juicefs", "seaweedfs")

# figure key -> (label, unit, higher is better, has a raw figure)
FIGURES = [
    ("seqwrite", "seq write 1 MiB, {size}, end_fsync", "MiB/s", True, True),
    ("seqwrite_durable", "  durable: + sync after fio", "MiB/s", True, True),
    ("seqwrite_cpu", "  CPU s per GiB written", "s/GiB", False, False),
    ("coldread", "cold seq read 1 MiB", "MiB/s", True, True),
    ("writers4", "4 writers x {quarter}, 1 MiB, end_fsync", "MiB/s", True, True),
    ("writers4_durable", "  durable: + sync after fio", "MiB/s", True, True),
    ("writers4_cpu", "  CPU s per GiB written", "s/GiB", False, False),
    ("randwrite", "4 KiB randwrite + fsync, 64 MiB", "IOPS", True, True),
    ("fsmark", "fs_mark {files} x 4 KiB, 1 thread, -S 0", "files/s", True, True),
    ("sqlite", "SQLite {inserts} txns, DELETE, FULL", "ins/s", True, True),
    ("tar_x", "tar -x /usr/share/doc ({entries} entries)", "s", False, True),
    ("tar_x_durable", "  durable: + sync after tar", "s", False, True),
    ("find", "find | wc -l of it", "s", False, True),
    ("rm", "rm -rf of it", "s", False, True),
]


def comm(pid):
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def pids(mode, arg, names):
    me = os.getpid()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        pid = int(name)
        if comm(pid) not in names or is_zombie(pid):
            continue
        if mode == "tag" and environ_has(pid, f"SPILLWAY_RUN_TAG={arg}".encode()):
            found.append(pid)
        elif mode == "cmd" and arg in cmdline(pid):
            found.append(pid)
    return sorted(found)


def ticks(pid_list):
    total = 0
    for pid in pid_list:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError):
            pass
    return total


def strace_counts(path):
    counts = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 5 and parts[-1] in ("fsync", "fdatasync", "sync_file_range", "syncfs"):
                counts[parts[-1]] = int(parts[3])
    total = sum(counts.values())
    detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    return f"{total} ({detail})" if detail else "0"


def seaweed_nodes(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        topo = json.load(r)["Topology"]
    return sum(len(rack.get("DataNodes") or []) for dc in (topo.get("DataCenters") or [])
               for rack in (dc.get("Racks") or []))


def num(v):
    try:
        return float(v)
    except ValueError:
        return None


def fmt(v):
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if abs(v) >= 0.01 else f"{v:.2g}"


def fmt_ratio(r):
    if r is None:
        return "-"
    return f"{r:.2f}" if r >= 0.1 else f"{r:.3f}"


def ratio(v, ref, higher):
    """>1 means v is faster/better than ref, whatever the unit."""
    if v is None or ref is None or v == 0 or ref == 0:
        return None
    return v / ref if higher else ref / v


def table(results_path, tsv_path):
    meta, systems, down, fsync, notes = {}, [], {}, {}, []
    runs = {}  # (figure, system) -> [values or failure strings]
    for line in open(results_path):
        f = line.rstrip("\n").split("\t")
        if f[0] == "meta":
            meta[f[1]] = f[2]
        elif f[0] == "system":
            systems.append(f[1])
        elif f[0] == "down":
            down[f[1]] = f[2]
        elif f[0] == "fsync":
            fsync[f[1]] = f[2]
        elif f[0] == "note":
            notes.append(f[1])
        elif f[0] == "result":
            runs.setdefault((f[2], f[3]), []).append(f[4])

    print(f"\n==> Spillway and its peers: commit {meta.get('commit', '?')}, {meta.get('date', '?')}, "
          f"kernel {meta.get('kernel', '?')}")
    for key in ("fs", "reps", "versions"):
        if key in meta:
            print(f"    {key}: {meta[key]}")
    print("    storage syncs (fsync/fdatasync/sync_file_range/syncfs by the system's own processes) "
          "for 20 application write+fsync calls:")
    for s in systems:
        print(f"      {s:10} {fsync[s] if s in fsync else 'n/a (' + down[s] + ')' if s in down else '-'}")

    labels = {k: label.format(size=meta.get("size", "?"), quarter=meta.get("quarter", "?"),
                              files=meta.get("files", "?"), inserts=meta.get("inserts", "?"),
                              entries=meta.get("entries", "?"))
              for k, label, _u, _h, _r in FIGURES}
    rows = []  # (key, unit, higher, {system: median}, {system: spread}, {system: failure text})
    partial = set()  # (key, system): some runs failed, the median is of the others
    measured = set()  # systems with at least one figure
    for key, _label, unit, higher, has_raw in FIGURES:
        med, spread, fail = {}, {}, {}
        for s in systems:
            vals = runs.get((key, s), [])
            nums = [num(v) for v in vals if num(v) is not None]
            if nums:
                measured.add(s)
                if len(nums) < len(vals):
                    partial.add((key, s))
                med[s] = statistics.median(nums)
                if len(nums) > 1 and min(nums) > 0:
                    spread[s] = max(nums) / min(nums) - 1
            elif s in down:
                fail[s] = f"n/a ({down[s]})"
            elif vals:
                fail[s] = next(v for v in vals if num(v) is None)
        if not any(runs.get((key, s)) for s in systems):
            continue
        if not has_raw:
            med.pop("raw", None)
        rows.append((key, unit, higher, med, spread, fail))

    head = ["workload", "unit"] + systems + ["best peer", "Spillway / best peer"]
    out, tsv = [head], []
    tsv.append(["workload", "unit", "better"]
               + [f"{s}{c}" for s in systems for c in ("", "/raw", "/best_peer", " spread")]
               + ["best_peer", "spillway/best_peer"])
    parent = ""
    for key, unit, higher, med, spread, fail in rows:
        if not labels[key].startswith(" "):
            parent = labels[key]
        tsv_label = f"{parent}: {labels[key].strip()}" if labels[key].startswith(" ") else labels[key]
        peers = [(med[p], p) for p in PEERS if p in med]
        best = (max(peers) if higher else min(peers)) if peers else None
        raw = med.get("raw")
        cells, tcells = [], []
        for s in systems:
            if s in med:
                r1, r2 = ratio(med[s], raw, higher), ratio(med[s], best[0] if best else None, higher)
                parts = [fmt(med[s])]
                extra = [f"{fmt_ratio(r1)}r" if r1 is not None and s != "raw" else "",
                         f"{fmt_ratio(r2)}p" if r2 is not None and s != "raw" else ""]
                extra = [e for e in extra if e]
                star = " *" if (key, s) in partial else ""
                cells.append(parts[0] + (f" ({' '.join(extra)})" if extra else "") + star)
                tcells += [fmt(med[s]), fmt_ratio(r1) if s != "raw" else "-", fmt_ratio(r2) if s != "raw" else "-",
                           f"{spread[s] * 100:.0f}%" if s in spread else "-"]
            else:
                text = fail.get(s, "-")
                cells.append(text if len(text) <= 28 else text[:27] + "…")
                tcells += [text, "-", "-", "-"]
        sw = ratio(med.get("spillway"), best[0] if best else None, higher)
        best_txt = f"{fmt(best[0])} ({best[1]})" if best else "-"
        out.append([labels[key], unit] + cells + [best_txt, f"{fmt_ratio(sw)}x" if sw is not None else "-"])
        tsv.append([tsv_label, unit, "higher" if higher else "lower"] + tcells
                   + [best[1] if best else "-", fmt_ratio(sw)])

    print("\n    Each cell: median (ratio to raw r, ratio to the best peer p); ratios > 1 always mean")
    print("    faster or cheaper (times and CPU are inverted). Best peer = best of GlusterFS, JuiceFS,")
    print("    SeaweedFS; rank by the durable rows (data on disk when the clock stops).\n")
    print_table(out)

    print("\n    Spread between repetitions (max/min - 1):\n")
    sp = [["workload"] + systems]
    for key, _unit, _higher, _med, spread, _fail in rows:
        sp.append([labels[key]] + [f"{spread[s] * 100:.0f}%" if s in spread else "-" for s in systems])
    print_table(sp)
    for s in systems:
        if fsync.get(s, "").startswith("0"):
            notes.append(f"{s} made no storage sync for 20 application fsyncs: its randwrite+fsync and "
                         "SQLite figures do not wait for the disk (the durable rows do, through the sync)")
    for s in systems:
        if s in down:
            notes.append(f"{s}: n/a ({down[s]})"
                         + ("; its figures come from the runs done before that" if s in measured else ""))
    if partial:
        notes.append("*: some runs failed (see the warnings in the log); the median is of the others")
    if notes:
        print("\n    Notes:")
        for n in notes:
            print(f"    - {n}")
    if tsv_path:
        with open(tsv_path, "w") as f:
            for m in sorted(meta):
                f.write(f"# {m}\t{meta[m]}\n")
            for s in systems:
                f.write(f"# fsync {s}\t{fsync[s] if s in fsync else 'n/a (' + down[s] + ')' if s in down else '-'}\n")
            for r in tsv:
                f.write("\t".join(r) + "\n")
        print(f"\n    TSV written to {tsv_path}")


def print_table(rows):
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, r in enumerate(rows):
        print("    " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if n == 0:
            print("    " + "  ".join("-" * w for w in widths))


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "pids" and len(argv) >= 5:
        print(" ".join(str(p) for p in pids(argv[2], argv[3], set(argv[4:]))))
    elif cmd == "ticks":
        print(ticks(int(p) for p in argv[2:]))
    elif cmd == "strace-counts" and len(argv) == 3:
        print(strace_counts(argv[2]))
    elif cmd == "seaweed-nodes" and len(argv) == 3:
        print(seaweed_nodes(argv[2]))
    elif cmd == "table" and len(argv) in (3, 4):
        table(argv[2], argv[3] if len(argv) == 4 else "")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""One table from bench/run_tp.sh's results: opfuse's tensor-parallel large MLP (fusec bench
--nproc N reports, rank 0's) and PyTorch's (mlp_tp.py rows), forward+backward, per tp and sp.

Per row: the median time per iteration; the scaling efficiency t(tp 1) / (tp * t(tp)) against the
same system and precision on one GPU; opfuse's time over the fastest PyTorch variant of the same
precision (bf16 against eager and torch.compile bf16, FP8 against torch.compile FP8) at the same
tp and sp; for opfuse the collectives' and the amax all-reduce's time per step (from the
per-step breakdown).

  python3 bench/peers/summarize_tp.py WORK_DIR [--json OUT]
"""

import argparse
import glob
import json
import os
import re
import sys


def opfuse_rows(work):
    rows = []
    for path in sorted(glob.glob(os.path.join(work, "opfuse_tp*.json"))):
        match = re.match(r"opfuse_tp(\d+)(_sp)?_(.+)\.json$", os.path.basename(path))
        if not match:
            continue
        with open(path) as f:
            report = json.load(f)
        tp = int(match.group(1))
        amax = [s for s in report["steps"] if s["what"].startswith("amax all-reduce")]
        amax_ms = amax[0]["time_ms"]["median"] if amax and amax[0].get("ran") else None
        rows.append(
            {
                "system": "opfuse",
                "variant": match.group(3),
                "fp8": match.group(3).startswith("fp8"),
                "tp": tp,
                "sp": bool(match.group(2)) if tp > 1 else None,
                "ms": report["time_ms"]["median"],
                "device_ms": report["device_time_ms"]["median"],
                "collective_ms": report["summary"].get("collective_ms"),
                "amax_allreduce_ms": amax_ms,
                "device": report["device"]["name"],
            }
        )
    return rows


def peer_rows(work):
    rows = []
    for path in sorted(glob.glob(os.path.join(work, "peers_tp*.json"))):
        with open(path) as f:
            for row in json.load(f)["rows"]:
                if row["mode"] != "fwdbwd":
                    continue
                rows.append(
                    {
                        "system": "pytorch",
                        "variant": row["variant"],
                        "fp8": row["variant"].endswith("fp8"),
                        "tp": row["tp"],
                        "sp": row["sp"] if row["tp"] > 1 else None,
                        "ms": row["median_ms"],
                        "device": row["device"],
                    }
                )
    return rows


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = opfuse_rows(args.work) + peer_rows(args.work)
    one_gpu = {(r["system"], r["variant"]): r["ms"] for r in rows if r["tp"] == 1}
    for r in rows:
        base = one_gpu.get((r["system"], r["variant"]))
        r["efficiency"] = base / (r["tp"] * r["ms"]) if base and r["tp"] > 1 else None
        if r["system"] == "opfuse":
            peers = [
                p["ms"]
                for p in rows
                if p["system"] == "pytorch"
                and p["fp8"] == r["fp8"]
                and p["tp"] == r["tp"]
                and p["sp"] == r["sp"]
            ]
            r["vs_best_pytorch"] = r["ms"] / min(peers) if peers else None
    rows.sort(key=lambda r: (r["tp"], str(r["sp"]), r["fp8"], r["system"] != "opfuse", r["ms"]))

    def cell(value, spec):
        return "-" if value is None else format(value, spec)

    header = (
        f"{'tp':>2}  {'sp':<5}  {'system':<7}  {'variant':<12}  {'ms':>8}  {'eff':>5}  "
        f"{'vs PyTorch':>10}  {'comm ms':>7}  {'amax ms':>7}"
    )
    print("seed MLP, large (tokens 16384, hidden 4096, ffn 28672), forward+backward; device:",
          rows[0]["device"] if rows else "-")
    print(header)
    for r in rows:
        print(
            f"{r['tp']:>2}  {cell(r['sp'], ''):<5}  {r['system']:<7}  {r['variant']:<12}  "
            f"{r['ms']:>8.3f}  {cell(r['efficiency'], '.1%'):>5}  "
            f"{cell(r.get('vs_best_pytorch'), '.2f'):>10}  {cell(r.get('collective_ms'), '.3f'):>7}  "
            f"{cell(r.get('amax_allreduce_ms'), '.4f'):>7}"
        )
    print(
        "eff: time on one GPU / (tp x time on tp GPUs), same system and variant; vs PyTorch: "
        "opfuse's time over the fastest PyTorch variant of the same precision, tp and sp; comm: "
        "opfuse's collective steps per iteration (waiting for the other rank included); amax: "
        "its one amax all-reduce per step"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

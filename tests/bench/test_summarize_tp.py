#!/usr/bin/env python3
"""bench/peers/summarize_tp.py on made-up reports of bench/run_tp.sh (the files' real layout:
fusec bench --json of each opfuse run, mlp_tp.py --json of each PyTorch tp): the scaling
efficiency, opfuse over the fastest PyTorch variant of its precision, tp and sp, and the amax
all-reduce's time taken from the per-step breakdown."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SUMMARIZE = os.path.join(HERE, "..", "..", "bench", "peers", "summarize_tp.py")


def opfuse_report(ms, collective_ms=None, amax_ms=None):
    steps = [{"what": "fc1 fprop", "kind": "gemm", "ran": True, "time_ms": {"median": 1.0}}]
    if amax_ms is not None:
        steps.append(
            {
                "what": "amax all-reduce (max over 2 ranks, 9 quantizers)",
                "kind": "collective",
                "ran": True,
                "time_ms": {"median": amax_ms},
            }
        )
    return {
        "device": {"name": "NVIDIA H100 80GB HBM3"},
        "time_ms": {"median": ms},
        "device_time_ms": {"median": ms - 0.1},
        "summary": {"collective_ms": collective_ms},
        "steps": steps,
    }


def peer_rows(tp, rows):
    return {
        "script": "mlp_tp.py",
        "rows": [
            {
                "mode": "fwdbwd",
                "variant": variant,
                "tp": tp,
                "sp": sp,
                "median_ms": ms,
                "device": "NVIDIA H100 80GB HBM3",
            }
            for variant, sp, ms in rows
        ],
    }


class SummarizeTp(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="opfuse-tp-")
        files = {
            "opfuse_tp1_fp8_delayed.json": opfuse_report(16.0),
            "opfuse_tp2_fp8_delayed.json": opfuse_report(8.5, 0.6, 0.02),
            "opfuse_tp2_sp_fp8_delayed.json": opfuse_report(9.0, 0.9, 0.02),
            "opfuse_tp1_bf16.json": opfuse_report(26.0),
            "opfuse_tp2_bf16.json": opfuse_report(13.5, 0.6),
            "peers_tp1.json": peer_rows(
                1, [("eager", None, 40.0), ("compile", None, 30.0), ("compile_fp8", None, 20.0)]
            ),
            "peers_tp2.json": peer_rows(
                2,
                [
                    ("eager", False, 21.0),
                    ("compile", False, 16.0),
                    ("compile_fp8", False, 12.0),
                    ("compile_fp8", True, 10.0),
                ],
            ),
        }
        for name, content in files.items():
            with open(os.path.join(cls.work, name), "w", encoding="utf-8") as handle:
                json.dump(content, handle)
        out = os.path.join(cls.work, "tp.json")
        result = subprocess.run(
            [sys.executable, SUMMARIZE, cls.work, "--json", out],
            capture_output=True,
            text=True,
            check=False,
        )
        cls.returncode, cls.stdout, cls.stderr = result.returncode, result.stdout, result.stderr
        with open(out, encoding="utf-8") as handle:
            cls.rows = json.load(handle)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def row(self, system, variant, tp, sp):
        found = [
            r
            for r in self.rows
            if (r["system"], r["variant"], r["tp"], r["sp"]) == (system, variant, tp, sp)
        ]
        self.assertEqual(len(found), 1, f"{system} {variant} tp {tp} sp {sp}")
        return found[0]

    def test_runs(self):
        self.assertEqual(self.returncode, 0, self.stderr)
        self.assertIn("NVIDIA H100 80GB HBM3", self.stdout)

    def test_efficiency_is_against_the_same_system_and_variant_on_one_gpu(self):
        self.assertAlmostEqual(self.row("opfuse", "fp8_delayed", 2, False)["efficiency"], 16 / 17)
        self.assertAlmostEqual(self.row("opfuse", "fp8_delayed", 2, True)["efficiency"], 16 / 18)
        self.assertAlmostEqual(self.row("opfuse", "bf16", 2, False)["efficiency"], 26 / 27)
        self.assertAlmostEqual(self.row("pytorch", "compile", 2, False)["efficiency"], 30 / 32)
        self.assertIsNone(self.row("opfuse", "bf16", 1, None)["efficiency"])

    def test_opfuse_is_compared_with_the_fastest_peer_of_its_precision_tp_and_sp(self):
        self.assertAlmostEqual(self.row("opfuse", "fp8_delayed", 2, False)["vs_best_pytorch"], 8.5 / 12)
        self.assertAlmostEqual(self.row("opfuse", "fp8_delayed", 2, True)["vs_best_pytorch"], 9 / 10)
        self.assertAlmostEqual(self.row("opfuse", "bf16", 2, False)["vs_best_pytorch"], 13.5 / 16)
        self.assertAlmostEqual(self.row("opfuse", "bf16", 1, None)["vs_best_pytorch"], 26 / 30)
        self.assertAlmostEqual(self.row("opfuse", "fp8_delayed", 1, None)["vs_best_pytorch"], 16 / 20)

    def test_the_amax_all_reduce_comes_from_the_breakdown(self):
        self.assertAlmostEqual(self.row("opfuse", "fp8_delayed", 2, False)["amax_allreduce_ms"], 0.02)
        self.assertIsNone(self.row("opfuse", "bf16", 2, False)["amax_allreduce_ms"])
        self.assertAlmostEqual(self.row("opfuse", "fp8_delayed", 2, True)["collective_ms"], 0.9)


if __name__ == "__main__":
    unittest.main()

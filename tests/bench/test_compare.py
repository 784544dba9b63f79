#!/usr/bin/env python3
"""bench/compare.py on a recorded run (tests/bench/compare_fixture: JSON files of the H200 run at
dec4690, bench/RESULTS.md, with the interleaved MLP forward of a later H200 run): the side-by-side
ratios, the goals it reports and the interleaved GEMM and MLP tables. Runs on a copy, since compare.py writes compare.json next to its inputs."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
COMPARE = os.path.join(HERE, "..", "..", "bench", "compare.py")


class CompareOnARecordedRun(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="opfuse-compare-")
        fixture = os.path.join(HERE, "compare_fixture")
        for name in os.listdir(fixture):
            shutil.copy(os.path.join(fixture, name), cls.work)
        result = subprocess.run(
            [sys.executable, COMPARE, cls.work], capture_output=True, text=True, check=False
        )
        cls.returncode, cls.stdout, cls.stderr = result.returncode, result.stdout, result.stderr
        with open(os.path.join(cls.work, "compare.json"), encoding="utf-8") as handle:
            cls.summary = json.load(handle)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def goal(self, text):
        found = [g for g in self.summary["goals"] if g["text"].split(":")[0] == text]
        listed = [g["text"] for g in self.summary["goals"]]
        self.assertEqual(len(found), 1, f"{text!r} in {listed}")
        return found[0]["text"]

    def test_runs_cleanly(self):
        self.assertEqual(self.returncode, 0, self.stderr)

    def test_large_ratios_against_the_peers_of_the_same_run(self):
        rows = {(r["workload"], r["mode"], r["recipe"]): r for r in self.summary["workloads"]}
        fwd = rows[("large", "fwd", "fp8 delayed")]
        self.assertAlmostEqual(fwd["x_compile_fp8"], fwd["opfuse_ms"] / fwd["torch_compile_fp8_ms"])
        text = self.goal("large fp8 delayed fwd vs torch.compile FP8")
        self.assertIn("0.866x (limit 0.83x) MISSED", text)
        self.assertIn("MISSED", self.goal("large fp8 delayed fwdbwd vs torch.compile bf16"))

    def test_the_gemm_goal_comes_from_the_interleaved_measurement(self):
        text = self.goal("worst FP8 GEMM vs torch._scaled_mm (interleaved)")
        self.assertIn("1.004x (limit 1.03x) MET", text)
        rows = self.summary["gemms_interleaved"]
        self.assertEqual(len(rows), 12)
        self.assertTrue(all(r["same_bits"] for r in rows))
        self.assertIn("FP8 GEMMs interleaved", self.stdout)

    def test_the_large_forward_also_goes_by_the_interleaved_measurement(self):
        # bench/peers/mlp_interleaved.py, H200, 2026-11-25 (scales calibrated by 4 steps).
        text = self.goal("large fp8 delayed fwd vs torch.compile FP8 (interleaved)")
        self.assertIn("0.849x (limit 0.83x) MISSED", text)
        text = self.goal("large fp8 delayed fwd vs torch.compile bf16 (interleaved)")
        self.assertIn("0.542x (limit 0.52x) MISSED", text)
        rows = {r["peer"]: r for r in self.summary["mlp_interleaved"]}
        self.assertEqual(sorted(rows), ["compile", "compile_fp8"])
        fp8 = rows["compile_fp8"]
        self.assertLessEqual(fp8["ratio_min"], fp8["ratio"])
        self.assertLessEqual(fp8["ratio"], fp8["ratio_max"])
        self.assertIn("seed MLP forward interleaved", self.stdout)
        # The separate-runs goal is still listed, under its own name.
        self.assertIn("0.866x", self.goal("large fp8 delayed fwd vs torch.compile FP8"))

    def test_the_training_step_goals_come_from_the_interleaved_training_steps(self):
        # mlp_interleaved.py --mode fwdbwd, one file per recipe (H200, 2026-11-28): issue 22's
        # goal against TE, issue 18's block goal and issue 6's against torch.compile bf16.
        text = self.goal("large fp8 delayed fwd+bwd vs Transformer Engine (interleaved)")
        self.assertIn("0.992x (limit 0.9x) MISSED", text)
        text = self.goal("large fp8 block fwd+bwd vs torch.compile bf16 (interleaved)")
        self.assertIn("0.695x (limit 0.7x) MET", text)
        text = self.goal("large fp8 delayed fwd+bwd vs torch.compile bf16 (interleaved)")
        self.assertIn("0.549x (limit 0.55x) MET", text)
        rows = {(r["recipe"], r["peer"]): r for r in self.summary["training_interleaved"]}
        self.assertEqual(sorted(rows), [("fp8_block", "compile"), ("fp8_block", "te"),
                                        ("fp8_delayed", "compile"), ("fp8_delayed", "te")])
        self.assertTrue(all(r["mode"] == "fwdbwd" for r in rows.values()))
        # No goal against TE under block scaling: that row is a table row only.
        self.assertFalse(any("fp8 block fwd+bwd vs Transformer Engine" in g["text"]
                             for g in self.summary["goals"]))
        self.assertIn("seed MLP training step interleaved", self.stdout)
        # The forward's interleaved table keeps the forward rows only.
        self.assertTrue(all(r.get("mode", "fwd") == "fwd" for r in self.summary["mlp_interleaved"]))

    def test_the_gemms_against_te_come_from_the_profile_of_both_steps(self):
        # gemm_kernels.py --sides te,opfuse,opfuse_own --rounds 3 (H200, 2026-11-28): per GEMM
        # the mean over rounds of each side's device time; the goal is the slowest GEMM's ratio.
        rows = self.summary["gemm_kernels"]
        self.assertEqual(len(rows), 6)
        self.assertTrue(all(r["same_kernel"] for r in rows))
        self.assertEqual(rows[0]["kernel"], "nvjet_sm90_qqtst_192x192_128x4_2x1_v_bz_coopB_TNN")
        for r in rows:
            self.assertAlmostEqual(r["ratio"], r["opfuse_ms"] / r["te_ms"])
        text = self.goal("large fp8 delayed slowest GEMM vs TE's same GEMM (#0, profiled)")
        self.assertIn("1.019x (limit 1.0x) MISSED", text)
        self.assertIn("training step's GEMMs against TE's", self.stdout)

    def test_autotuned_interleaved_rows_are_goals_of_their_own(self):
        # mlp_interleaved.py --gemm-algorithms heuristic,autotuned: the fixture's rows (written
        # before the option) count as heuristic; an autotuned row is listed under its own name.
        work = tempfile.mkdtemp(prefix="opfuse-compare-tuned-")
        self.addCleanup(shutil.rmtree, work, True)
        fixture = os.path.join(HERE, "compare_fixture")
        for name in os.listdir(fixture):
            shutil.copy(os.path.join(fixture, name), work)
        path = os.path.join(work, "peers_mlp_interleaved.json")
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        tuned = dict(next(r for r in data["results"] if r.get("peer") == "compile_fp8"))
        tuned.update(gemm_algorithms="autotuned", ratio=0.82, ratio_min=0.81, ratio_max=0.84)
        data["results"].append(tuned)
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        subprocess.run([sys.executable, COMPARE, work], capture_output=True, check=True)
        with open(os.path.join(work, "compare.json"), encoding="utf-8") as handle:
            goals = [g["text"] for g in json.load(handle)["goals"]]
        self.assertIn(
            "large fp8 delayed fwd autotuned GEMMs vs torch.compile FP8 (interleaved): 0.820x"
            " (limit 0.83x) MET",
            goals,
        )
        self.assertIn("0.849x (limit 0.83x) MISSED",
                      "".join(g for g in goals if g.startswith(
                          "large fp8 delayed fwd vs torch.compile FP8 (interleaved)")))
        rows = self.summary["mlp_interleaved"]
        self.assertEqual({r["gemm_algorithms"] for r in rows}, {"heuristic"})

    def test_rows_against_transformer_engine_under_the_same_recipe(self):
        # A made-up peers_te.json in bench/peers/te_peers.py's layout: each default opfuse row is
        # compared with TE's variant of its recipe at the same size and mode; other rows are not.
        # (The table of the step's GEMMs against TE's, from peers_gemm_kernels.json, is another.)
        self.assertNotIn("x TE", self.stdout, "no TE columns without peers_te.json")
        work = tempfile.mkdtemp(prefix="opfuse-compare-te-")
        self.addCleanup(shutil.rmtree, work, True)
        fixture = os.path.join(HERE, "compare_fixture")
        for name in os.listdir(fixture):
            shutil.copy(os.path.join(fixture, name), work)
        te = {
            "script": "te_peers",
            "device": "NVIDIA H200",
            "transformer_engine": "2.20.2",
            "results": [
                {"size": "large", "mode": "fwd", "variant": "te_fp8_delayed", "median_ms": 5.0,
                 "gpu_median_ms": 4.0},
                {"size": "large", "mode": "fwdbwd", "variant": "te_fp8_delayed",
                 "median_ms": 20.0, "gpu_median_ms": 16.0},
                {"size": "large", "mode": "fwd", "variant": "te_bf16", "median_ms": 9.0},
                {"size": "tiny", "mode": "fwd", "variant": "te_fp8_current", "median_ms": 1.0},
                {"size": "tiny", "mode": "fwd", "variant": "te_fp8_delayed",
                 "skipped": "time budget"},
            ],
        }
        with open(os.path.join(work, "peers_te.json"), "w", encoding="utf-8") as handle:
            json.dump(te, handle)
        result = subprocess.run([sys.executable, COMPARE, work], capture_output=True, text=True,
                                check=True)
        self.assertIn("Transformer Engine 2.20.2", result.stdout)
        self.assertIn("x TE", result.stdout)
        with open(os.path.join(work, "compare.json"), encoding="utf-8") as handle:
            rows = json.load(handle)["workloads"]
        by_key = {(r["workload"], r["mode"], r["recipe"]): r for r in rows}
        fwd = by_key[("large", "fwd", "fp8 delayed")]
        self.assertEqual(fwd["te_ms"], 5.0)
        self.assertAlmostEqual(fwd["x_te"], fwd["opfuse_ms"] / 5.0)
        self.assertAlmostEqual(fwd["x_te_device"], fwd["opfuse_device_ms"] / 4.0)
        fwdbwd = by_key[("large", "fwdbwd", "fp8 delayed")]
        self.assertAlmostEqual(fwdbwd["x_te"], fwdbwd["opfuse_ms"] / 20.0)
        # The tiny fp8 delayed runs: TE skipped that one; graph and step-by-step rows are not
        # opfuse's defaults and get no TE ratio.
        for row in rows:
            if row["workload"] == "tiny":
                self.assertNotIn("x_te", row, row["mode"])

    def test_step_by_step_rows_are_not_host_time_goals(self):
        self.assertIn("MET", self.goal("tiny fp8 delayed fwd host time per call"))
        self.assertIn("MET", self.goal("tiny fp8 delayed fwd graph host time per call"))
        self.assertFalse(any("step-by-step" in g["text"] for g in self.summary["goals"]))
        modes = {r["mode"] for r in self.summary["workloads"] if r["workload"] == "tiny"}
        self.assertIn("fwd step-by-step", modes)  # still in the table


if __name__ == "__main__":
    unittest.main()

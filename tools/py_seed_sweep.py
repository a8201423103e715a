#!/usr/bin/env python3
"""test_models.py::test_llama_against_plain_torch over seeds, every check logged, none asserted.

For each seed S..S+N-1 and each of the test's four cases (untied/tied x unpadded/padded), on
the device given, every check_rule call of the test appends one line to LOG:
    seed  tied  padded  check-name  coda-error  torch-bf16-error  share
share = error / (2 x torch's error + atol), above 1 a failure of the section 7 rule (the loss's
per-token check_loss still asserts). A case that raises is logged as one line named "error ...",
share 99. Then the summary: runs, failures, the largest shares.
usage: python3 tools/py_seed_sweep.py FIRST N LOG [--device cpu|cuda]
       (needs torch and coda, as tests/python does; run two processes on two ranges for speed)
"""

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.append(os.path.join(ROOT, "python"))  # after an installed coda, as conftest.py does

import torch  # noqa: E402
from _pytest.monkeypatch import MonkeyPatch  # noqa: E402

import conftest  # noqa: E402,F401  (puts the source tree's coda on the path if none installed)
import test_models as T  # noqa: E402
import torch_reference as R  # noqa: E402


def summary(log):
    runs, fails, rows = set(), set(), []
    for line in open(log):
        seed, tied, padded, name, err, base, share = line.rstrip("\n").split("\t")
        runs.add((seed, tied, padded))
        if float(share) > 1:
            fails.add((seed, tied, padded))
        rows.append((float(share), name, seed, tied, padded))
    print("%d runs (seed, tied, padded), %d failing, %d checks"
          % (len(runs), len(fails), len(rows)))
    for share, name, seed, tied, padded in sorted(rows, reverse=True)[:5]:
        print("  share %.3f  %s  (seed %s, tied=%s, padded=%s)" % (share, name, seed, tied, padded))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("first", type=int)
    p.add_argument("n", type=int)
    p.add_argument("log")
    p.add_argument("--device", default="cpu")
    a = p.parse_args()
    torch.set_num_threads(1)  # one core a process: run ranges side by side
    case = {}
    with open(a.log, "a") as f:
        def logged(name, got, ref_fp32, torch_bf16, context="", atol=1e-6):
            err, base = R.max_err(got, ref_fp32), R.max_err(torch_bf16, ref_fp32)
            f.write("%d\t%d\t%d\t%s\t%.6e\t%.6e\t%.4f\n" % (
                case["seed"], case["tied"], case["padded"], name, err, base,
                err / (2 * base + atol)))
            return err, base
        R.check_rule = logged
        for seed in range(a.first, a.first + a.n):
            T.SEED = seed
            for tied in (False, True):
                for padded in (False, True):
                    case.update(seed=seed, tied=int(tied), padded=int(padded))
                    mp = MonkeyPatch()
                    try:
                        T.check_llama(a.device, tied, padded, mp)
                    except Exception as e:  # noqa: BLE001  (logged; the sweep goes on)
                        f.write("%d\t%d\t%d\terror %r\t0\t0\t99\n" % (seed, tied, padded, e))
                    finally:
                        mp.undo()
            f.flush()
    summary(a.log)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A Python model test over seeds, every check logged, none asserted.

--test models (default): test_models.py::test_llama_against_plain_torch's four cases
  (untied/tied x unpadded/padded);
--test hf: test_hf.py's test_matches_hf (coda.from_hf: fp32/bf16 source x rope/llama3 x
  untied/tied, 8 cases) and test_patch_hf_padded_batch_matches_hf (the patched model on a
  padded batch, untied/tied); needs transformers;
--test patch_hf: test_patch_hf.py's test_padded_batch_against_the_plain_forward (the patched
  stand-in, untied/tied; no transformers).
For each seed FIRST..FIRST+N-1, then each seed of --seeds, and each case, on the device given,
every check_rule call of the case appends one line to LOG:
    seed  case  check-name  coda-error  torch-bf16-error  share
share = error / (2 x torch's error + atol), above 1 a failure of the section 7 rule (the loss's
per-token check_loss and the exact checks, e.g. the HF gradients' mapping, still assert). A case
that raises is logged as one line named "error ...", share 99. Then the summary: runs,
failures, the largest shares.
usage: python3 tools/py_seed_sweep.py FIRST N LOG [--test models|hf|patch_hf]
           [--device cpu|cuda] [--seeds S1,S2,...] [--threads T]
       (needs torch and coda, as tests/python does; one thread a process by default: run
       processes on seed ranges side by side for speed; N may be 0 with --seeds)
"""

import argparse
import itertools
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
sys.path.append(os.path.join(ROOT, "python"))  # after an installed coda, as conftest.py does

import torch  # noqa: E402
from _pytest.monkeypatch import MonkeyPatch  # noqa: E402

import conftest  # noqa: E402,F401  (puts the source tree's coda on the path if none installed)
import torch_reference as R  # noqa: E402


def cases(test):
    """(module, [(label, run(device, monkeypatch))]) of one test file's sweepable checks."""
    if test == "models":
        import test_models as T
        return T, [("%s,%s" % ("tied" if tied else "untied", "padded" if padded else "unpadded"),
                    lambda d, mp, tied=tied, padded=padded: T.check_llama(d, tied, padded, mp))
                   for tied, padded in itertools.product((False, True), (False, True))]
    if test == "hf":
        import test_hf as T
        out = [("from_hf,%s,%s,%s" % (source, "llama3" if rope else "rope",
                                      "tied" if tied else "untied"),
                lambda d, mp, s=source, r=rope, t=tied: T.check_matches_hf(d, s, r, t, mp))
               for source, rope, tied in itertools.product(("fp32", "bf16"), (None, T.LLAMA3),
                                                           (False, True))]
        out += [("patched,padded,%s" % ("tied" if tied else "untied"),
                 lambda d, mp, t=tied: T.check_patched_padded(d, t, mp))
                for tied in (False, True)]
        return T, out
    if test == "patch_hf":
        import test_patch_hf as T
        return T, [("patched_stand_in,padded,%s" % ("tied" if tied else "untied"),
                    lambda d, mp, t=tied: T.check_padded(d, t, mp)) for tied in (False, True)]
    raise SystemExit("unknown --test %r" % test)


def summary(log):
    runs, fails, rows = set(), set(), []
    for line in open(log):
        seed, case, name, err, base, share = line.rstrip("\n").split("\t")
        runs.add((seed, case))
        if float(share) > 1:
            fails.add((seed, case))
        rows.append((float(share), name, seed, case))
    print("%d runs (seed, case), %d failing, %d checks" % (len(runs), len(fails), len(rows)))
    for share, name, seed, case in sorted(rows, reverse=True)[:5]:
        print("  share %.3f  %s  (seed %s, %s)" % (share, name, seed, case))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("first", type=int)
    p.add_argument("n", type=int)
    p.add_argument("log")
    p.add_argument("--test", default="models", choices=("models", "hf", "patch_hf"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--seeds", default="", help="more seeds, comma-separated")
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)  # one core a process by default: run ranges side by side
    module, runs = cases(a.test)
    seeds = list(range(a.first, a.first + a.n)) + [int(s) for s in a.seeds.split(",") if s]
    case = {}
    with open(a.log, "a") as f:
        def logged(name, got, ref_fp32, torch_bf16, context="", atol=1e-6):
            err, base = R.max_err(got, ref_fp32), R.max_err(torch_bf16, ref_fp32)
            f.write("%d\t%s\t%s\t%.6e\t%.6e\t%.4f\n" % (
                case["seed"], case["label"], name, err, base, err / (2 * base + atol)))
            return err, base
        R.check_rule = logged
        for seed in seeds:
            module.SEED = seed  # the test files draw their inputs from their global SEED
            for label, run in runs:
                case.update(seed=seed, label=label)
                mp = MonkeyPatch()
                try:
                    run(a.device, mp)
                except Exception as e:  # noqa: BLE001  (logged; the sweep goes on)
                    f.write("%d\t%s\terror %r\t0\t0\t99\n"
                            % (seed, label, str(e).replace("\t", " ").replace("\n", " ")))
                finally:
                    mp.undo()
            f.flush()
    summary(a.log)


if __name__ == "__main__":
    main()

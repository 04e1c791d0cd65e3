"""The client against a live stack (real nginx, the module and a worker
on the CPU backend), started by t/50-client.t which sets:

  MSV_URL          http://127.0.0.1:PORT of the nginx
  MSV_LOGITS       the maskserve-logits binary
  MSV_DUMMY        the worker's --dummy preset
  MSV_WORKER_SEED  the worker's --seed (it makes the dummy weights)
  MSV_LOGITS_BACKEND  the worker's --backend, for maskserve-logits (cpu)
  MSV_LOGITS_ARGS  more maskserve-logits flags (--batch-invariant when the
                   worker runs with it)

Packed answers decode to the very arrays of JSON ones in every mode,
streamed or not (greedy, whole-vocabulary rows, top logprobs, penalties,
aborted requests, random requests); the replay of the masks on the
backend's own logits gives the behaviour logprobs to 1e-5.
MSV_TEST_SEED changes the random seed.
"""

import os
import random
import subprocess
import tempfile
import unittest

import maskserve_client as mc
from maskserve_client import masks as mm

URL = os.environ.get("MSV_URL")
SEED = int(os.environ.get("MSV_TEST_SEED", "20261201"), 0)

if URL is None:
    raise unittest.SkipTest("MSV_URL is not set (t/50-client.t sets it)")

np = mm.np


def health():
    import json
    import urllib.request
    with urllib.request.urlopen(URL + "/health") as r:
        return json.loads(r.read())


VOCAB = health()["workers"][0]["vocab_size"]

MODES = ("off", "selected", "support")


def run(client, prompt, sp, mode, fmt, stream, **kw):
    return client.generate(prompt, sp, mask=mode != "off",
                           mode=mode if mode != "off" else "selected",
                           mask_format=fmt, stream=stream, **kw)


class Live(unittest.TestCase):

    replays = []

    @classmethod
    def setUpClass(cls):
        cls.c = mc.Client(URL)

    @classmethod
    def tearDownClass(cls):
        # after the per-test lines, for the record
        for line in cls.replays:
            print(line)

    def assertSameChoice(self, a, b, what):
        self.assertEqual(list(map(int, a.token_ids)),
                         list(map(int, b.token_ids)), what + ": tokens")
        self.assertEqual(a.finish_reason, b.finish_reason, what)
        self.assertEqual(a.mask is None, b.mask is None, what)
        if a.mask is not None:
            self.assertTrue(a.mask.same_as(b.mask), what + ": mask")
        self.assertEqual(a.top is None, b.top is None, what)
        if a.top is not None:
            self.assertTrue(a.top.same_as(b.top), what + ": top logprobs")

    def test_installed_package(self):
        # t/50-client.t runs these tests with the package pip installed
        want = os.environ.get("MSV_CLIENT_INSTALLED")
        if want:
            self.assertTrue(mc.__file__.startswith(want), mc.__file__)

    def test_packed_equals_json(self):
        cases = [
            ("top_k 8", {"top_k": 8}),
            ("greedy", {"temperature": 0.0}),
            ("whole vocabulary", {"top_k": -1, "top_p": 1.0}),
            ("top_p and min_p", {"top_p": 0.9, "min_p": 0.02,
                                 "temperature": 0.8}),
            ("logprobs", {"top_k": 20, "logprobs": 5}),
            ("penalties and bias", {"top_k": 50, "repetition_penalty": 1.2,
                                    "presence_penalty": 0.5,
                                    "frequency_penalty": 0.3,
                                    "logit_bias": {"5": 3.0},
                                    "logprobs": 2}),
        ]
        prompt = [1, 2, 3, 4, 5]
        for name, sp in cases:
            sp = dict(sp, max_tokens=12, seed=11, ignore_eos=True)
            for mode in MODES:
                ref = run(self.c, prompt, sp, mode, "json", False).choices[0]
                for fmt in ("json", "packed"):
                    for stream in (False, True):
                        what = "%s, %s, %s, stream %s" % (name, mode, fmt,
                                                          stream)
                        r = run(self.c, prompt, sp, mode, fmt, stream)
                        ch = r.choices[0]
                        self.assertSameChoice(ch, ref, what)
                        self.assertEqual(len(ch.token_ids), 12, what)
                        if stream:
                            self.assertGreaterEqual(r.events, 1)
                if mode == "off":
                    self.assertIsNone(ref.mask)
                    continue
                mc.check_mask(ref.mask, ref.token_ids, vocab=VOCAB)
                lengths = [int(x) for x in ref.mask.lengths]
                if name == "greedy":
                    self.assertEqual(lengths, [1] * 12)
                    self.assertEqual([float(x) for x in ref.mask.logprobs],
                                     [0.0] * 12)
                if name == "whole vocabulary":
                    self.assertEqual(lengths, [VOCAB] * 12,
                                     "rows hold the whole vocabulary")

    def test_aborted_request(self):
        sp = {"max_tokens": 3000, "ignore_eos": True, "seed": 3,
              "top_k": 30, "logprobs": 1}
        for fmt in ("packed", "json"):
            rid = "client-abort-%s" % fmt
            events = []
            for ev in self.c.stream([9, 8, 7], sp, mask=True, mode="support",
                                    mask_format=fmt, request_id=rid):
                events.append(ev)
                if len(events) == 2:
                    self.assertEqual(self.c.abort(rid)["aborted"], True)
            self.assertGreater(len(events), 2, "the abort came mid-stream")
            res = mc.merge_events(events, "support")
            ch = res.choices[0]
            self.assertEqual(ch.finish_reason, "abort", fmt)
            k = len(ch.token_ids)
            self.assertGreater(k, 0)
            self.assertLess(k, 3000)
            self.assertEqual(ch.mask.n_tokens, k)
            mc.check_mask(ch.mask, ch.token_ids, vocab=VOCAB)
            # the same seed, stopped at the same length, in the other form
            ref = self.c.generate([9, 8, 7], dict(sp, max_tokens=k), mask=True,
                                  mode="support",
                                  mask_format="json" if fmt == "packed"
                                  else "packed").choices[0]
            self.assertEqual(ref.finish_reason, "length")
            ref.finish_reason = "abort"
            self.assertSameChoice(ch, ref, "aborted %s" % fmt)

    def test_random_requests(self):
        rng = random.Random(SEED)
        for i in range(30):
            sp = {"max_tokens": rng.randint(1, 20), "seed": rng.randrange(2**63),
                  "temperature": rng.choice([0.0, 0.5, 1.0, 1.7]),
                  "top_k": rng.choice([-1, 1, 2, 17, 500]),
                  "top_p": rng.choice([1.0, 0.95, 0.5, 0.1]),
                  "min_p": rng.choice([0.0, 0.0, 0.05, 0.3])}
            if rng.random() < 0.4:
                sp["logprobs"] = rng.randint(0, 8)
            if rng.random() < 0.3:
                sp["stop_token_ids"] = rng.sample(range(VOCAB), 20)
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
            mode = rng.choice(MODES)
            stream = rng.random() < 0.5
            a = run(self.c, prompt, sp, mode, "json", stream)
            b = run(self.c, prompt, sp, mode, "packed", not stream
                    if rng.random() < 0.5 else stream)
            what = "random request %d: %r, %s" % (i, sp, mode)
            self.assertSameChoice(a.choices[0], b.choices[0], what)
            self.assertEqual(a.usage, b.usage, what)
            if mode != "off":
                mc.check_mask(b.choices[0].mask, b.choices[0].token_ids,
                              vocab=VOCAB)

    def test_packed_events_cover_their_tokens(self):
        sp = {"max_tokens": 40, "seed": 5, "top_k": 100, "ignore_eos": True,
              "logprobs": 3}
        n = 0
        for ev in self.c.stream([4, 4, 4], sp, mask=True, mode="support",
                                mask_format="packed"):
            ch = ev.choices[0]
            # decode_event checked it; the counts are the event's own
            self.assertEqual(ch.mask.n_tokens, len(ch.token_ids))
            self.assertEqual(ch.top.n_tokens, len(ch.token_ids))
            n += len(ch.token_ids)
        self.assertEqual(n, 40)

    def test_bad_mask_format(self):
        for v in ("binary", 5, True, ["packed"]):
            with self.assertRaises(mc.ServerError) as e:
                self.c.generate([1], {"max_tokens": 1}, mask_format=v)
            self.assertEqual(e.exception.status, 400)
            self.assertEqual(e.exception.param, "mask_format")

    @unittest.skipIf(np is None, "the replay needs numpy")
    def test_replay_reproduces_behaviour_logprobs(self):
        try:
            import torch
        except ImportError:
            torch = None
        if torch is None and os.environ.get("MSV_REQUIRE_TORCH"):
            self.fail("torch is required (MSV_REQUIRE_TORCH) but missing")
        cases = [
            ("support", {"temperature": 1.0, "top_k": 50}),
            ("support", {"temperature": 0.7, "top_p": 0.9}),
            ("selected", {"temperature": 1.3, "min_p": 0.05}),
            ("support", {"temperature": 1.0}),
            ("selected", {"temperature": 0.0}),
        ]
        prompt = [7, 8, 9, 10]
        with tempfile.TemporaryDirectory() as d:
            for k, (mode, sp) in enumerate(cases):
                sp = dict(sp, max_tokens=16, seed=100 + k, ignore_eos=True)
                ch = self.c.generate(prompt, sp, mask=True, mode=mode,
                                     mask_format="packed").choices[0]
                toks = [int(x) for x in ch.token_ids]
                logits = self.logits(d, prompt, toks)
                want = np.asarray(ch.mask.sampled_logprobs(toks))
                got, support = mc.replay_numpy(logits, ch.mask, toks,
                                               sp["temperature"])
                what = "%s %r" % (mode, sp)
                err = float(np.abs(got - want).max())
                self.assertLessEqual(err, 1e-5, what)
                self.replays.append("replay %s: max |replayed - behaviour| "
                                    "%.2e over %d tokens, %d ids"
                                    % (what, err, len(toks),
                                       len(ch.mask.ids)))
                if mode == "support":
                    self.assertLessEqual(
                        float(np.abs(support - ch.mask.logprobs).max()), 1e-5,
                        what)
                if torch is None:
                    continue
                lt = torch.from_numpy(logits).double().requires_grad_()
                tg, ts = mc.replay_torch(lt, ch.mask, toks, sp["temperature"])
                self.assertLessEqual(
                    float((tg.detach() - torch.from_numpy(want).double())
                          .abs().max()), 1e-5, what)
                tg.sum().backward()
                g = lt.grad.numpy()
                # the gradient lives on the support only and sums to zero
                # over each row
                inside = np.zeros_like(g, dtype=bool)
                rows = np.repeat(np.arange(len(toks)),
                                 np.diff(ch.mask.offsets))
                inside[rows, ch.mask.ids] = True
                self.assertEqual(float(np.abs(g[~inside]).max(initial=0)), 0)
                self.assertLess(float(np.abs(g.sum(axis=1)).max()), 1e-9)

    def logits(self, d, prompt, toks):
        out = os.path.join(d, "logits.f32")
        cmd = [os.environ["MSV_LOGITS"], "--dummy",
               os.environ.get("MSV_DUMMY", "tiny"), "--seed",
               os.environ.get("MSV_WORKER_SEED", "1"),
               "--backend", os.environ.get("MSV_LOGITS_BACKEND", "cpu"),
               "--prompt", ",".join(map(str, prompt)),
               "--tokens", ",".join(map(str, toks)), "--out", out]
        cmd += os.environ.get("MSV_LOGITS_ARGS", "").split()
        # its log (the CUDA backend's lines among them) kept out of the
        # test runner's output, shown only when it fails
        p = subprocess.run(cmd, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        if p.returncode != 0:
            self.fail("maskserve-logits exited %d: %s"
                      % (p.returncode, p.stderr.strip()))
        return np.fromfile(out, dtype="<f4").reshape(len(toks), VOCAB)


if __name__ == "__main__":
    unittest.main()

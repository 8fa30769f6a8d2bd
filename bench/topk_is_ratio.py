"""What TRL's vLLM importance-sampling correction would weigh a rollout by under a truncating sampler.

Under top-k / top-p, vLLM's ``processed_logprobs`` are log-probs of the truncated, renormalised distribution, the
trainer's of the full softmax, so each sampled token's log-ratio is log Z_kept <= 0 (the kept probability mass) and a
sequence's ratio is prod_t Z_kept(t). This samples with top-k from SmolLM2-135M-Instruct (the offline stand-in, CPU)
and prints the per-token kept mass and the resulting sequence ratios: the measurement behind the refusal of
``vllm_importance_sampling_correction`` with top_k / top_p / min_p (trainer/config/server.py, docs/paper-runs.md).

    .venv/bin/python bench/topk_is_ratio.py [--top_k 2] [--tokens 64] [--samples 4]
"""

from __future__ import annotations

import argparse
import math
import statistics

import benchlib  # noqa: F401  (offline environment, working-tree packages)
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from trainer.tools.assets import make_smollm2

PROMPTS = ["What is 17 + 25? Think step by step.", "Write a short poem about the sea.",
           "Explain why the sky is blue.", "List three prime numbers and explain."]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--top_k", type=int, default=2)
    p.add_argument("--tokens", type=int, default=64, help="sampled tokens per sequence (no EOS stop)")
    p.add_argument("--samples", type=int, default=4, help="sequences per prompt")
    args = p.parse_args()
    path = make_smollm2()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.manual_seed(0)
    log_z, ratios = [], []
    for prompt in PROMPTS:
        enc = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        with torch.no_grad():
            out = model.generate(enc["input_ids"].repeat(args.samples, 1),
                                 attention_mask=enc["attention_mask"].repeat(args.samples, 1), do_sample=True,
                                 temperature=1.0, top_k=args.top_k,
                                 top_p=1.0, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                                 output_logits=True, return_dict_in_generate=True, pad_token_id=tok.eos_token_id)
        raw = torch.stack(out.logits, dim=1).float()  # (samples, tokens, vocab): the full, unprocessed logits
        kept = torch.topk(raw, args.top_k, dim=-1).values
        z = torch.logsumexp(kept, -1) - torch.logsumexp(raw, -1)  # log Z_kept per sampled token
        log_z += z.flatten().tolist()
        ratios += torch.exp(z.sum(dim=1)).tolist()
    print(f"SmolLM2-135M-Instruct, T 1.0, top-k {args.top_k}, {len(ratios)} sequences of {args.tokens} tokens")
    print(f"kept mass per token: mean {statistics.fmean(math.exp(x) for x in log_z):.3f}, "
          f"min {math.exp(min(log_z)):.3f}")
    print(f"sequence ratio prod_t Z_kept: median {statistics.median(ratios):.3g}, "
          f"mean {statistics.fmean(ratios):.3g}, max {max(ratios):.3g} (1 = no bias)")


if __name__ == "__main__":
    main()

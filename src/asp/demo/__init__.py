"""The embedded demo world: a built-in task, a byte-level tokenizer and a tiny Qwen2 policy, all offline on CPU.

* `asp.demo.task`: step-by-step running sums mod 10 with heavy-tailed sizes and a verifiable reward.
* `asp.demo.tokenizer`: a one-token-per-byte Qwen2 tokenizer with a small chat template.
* `asp.demo.policy`: build, warm-start and evaluate the tiny policy (``python -m asp.demo.policy``).
"""

"""Speed-ups, applied around the paper's modules from outside: nothing in ``qkv.modules`` or ``qkv.models``
imports this package (tests/test_architecture.py holds the rule).

- ``kernels``: each decoding step's linear maps laid out for the kernel measured fastest on this CPU,
  for the time of a decoding (``decoding``), and put back after.
- ``compiled``: a GPT's decoding step compiled by ``torch.compile`` (``CompiledStep``), the model's
  linear maps, self-attention and caches transformed for it and restored by ``close()``.
- ``precompiled``: the same step compiled ahead of time (AOTInductor), kept in the user cache.
- ``quantize``: a copy of a model with int8 linear maps.

Which of them a GPT's generation runs is decided in one place, once a generation, beside the one decoding loop
that runs it: ``qkv.generation.policy.StepPolicy``.
"""

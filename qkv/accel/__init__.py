"""Speed-ups, applied around the paper's modules from outside: nothing in ``qkv.modules`` or ``qkv.models``
imports this package (tests/test_architecture.py holds the rule).

- ``swap``: the decoding model, a copy of a model's modules that shares its weights and into which the others
  swap their modules (``decoding_copy``, ``swap_modules``); the model a generation is given is never changed.
- ``kernels``: the decoding copy with caches and each step's linear maps laid out for the kernel measured
  fastest on this CPU (``decoding_model``).
- ``compiled``: a GPT's decoding step compiled by ``torch.compile`` (``CompiledStep``), on a step model of its
  own: the decoder's copy with the step's linear maps, self-attention and caches swapped for compiled forms.
- ``precompiled``: the same step compiled ahead of time (AOTInductor), kept in the user cache.
- ``quantize``: a copy of a model with int8 linear maps.

Which of them a GPT's generation runs is decided in one place, once a generation, beside the one decoding loop
that runs it: ``qkv.generation.policy.StepPolicy``.
"""

"""Rubric-based agentic RL: a small model learns the two atomic skills of the loop.

The skills are the LLM proposer's two requests (:mod:`stitchcuda.workflow.llm`): a planner
decision from the reference graph and plan, and the body of one task from its contract and the
Verifier's feedback. Modules, in the order a training run uses them:

``dataset``  examples generated offline from references and from run folders, with the loop's own
             prompt builders; deduplicated by prompt hash, split by reference
``judge``    a reply -> an Outcome: cheap checks in process (parse, Coder, static rules), the build,
             the run and the timing in the Verifier's child processes, in parallel, cached by body
``reward``   the rubric: Outcome -> Reward, every component logged, anti-hacking as hard penalties
``model``    the policy from a GGUF file or a model folder, LoRA adapters (PEFT)
``constrained`` the decision grammar as an automaton over token texts: decisions sampled as the
             loop samples them
``grpo``     the GRPO loop: group sampling, group-normalised advantages, clipped policy gradient with
             a KL penalty to the base model; checkpoints, resume, the learning curve
``export``   the adapter merged, written as a GGUF that llama.cpp loads as the loop's ``--llm``
``cli``      ``stitchcuda train dataset|run|eval|export``

``dataset``, ``judge`` and ``reward`` need only the project; ``model``, ``grpo`` and ``export``
need ``transformers``, ``peft`` and ``gguf`` (``pip install 'stitchcuda[train]'``).
"""

from __future__ import annotations

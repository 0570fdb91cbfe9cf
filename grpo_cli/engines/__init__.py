"""The two engines, siblings over the same plan, kernel and output layer.

:mod:`grpo_cli.engines.local` streams a dataset through this machine in two passes;
:mod:`grpo_cli.engines.ray` runs the same two steps as Ray Data jobs. Neither imports
the other; what they share lives below them (:mod:`grpo_cli.run.plan`,
:mod:`grpo_cli.run.reward_columns`, :mod:`grpo_cli.outputs.output`, :mod:`grpo_cli.results.summary`).
"""

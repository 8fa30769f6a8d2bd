"""PPO with a learned value function (``advantage: gae``), as verl and RAGEN-2 run it, all in this folder:

- ``fields.py``: its knobs, a mixin of ``WinnowConfig`` (``critic_*``, ``cliprange_value``, ``vf_coef``,
  ``gae_gamma`` / ``gae_lambda``);
- ``critic.py``: the value model (a scalar head on the policy's architecture), its optimizer and its update;
- ``stage.py``: the ``old_values`` row input, the ``advantage: gae`` stage (trainer/algorithms/gae.py) and the
  recipe checks;
- ``hook.py``: the ``ppo_critic`` method hook that builds the critic and trains it on every micro-batch;
- its docs page, docs/ppo.md.
"""

"""Training with posttrain_env: what a trainer needs beside the client.

- `outcome.py`: `RolloutOutcome`, what a trainer keeps of one finished rollout (its reward, None
  when unscored; its spend, and whether that spend is final);
- `sampler.py`: `SamplerBridge`, finished rollouts as RFC 013-shaped `TaskSampler.update(task,
  rewards, costs)` calls, with the cost unit and the policy for unscored rollouts explicit;
- `rollout.py`: `rollout(env, policy, task_id) -> (reward | None, cost, transcript)`, one episode
  for any trainer that takes an async rollout callable;
- `trl_env.py`: the environment for TRL's `GRPOTrainer(environment_factory=...)` and its reward
  function (None excluded from the group baseline by TRL itself from 1.6.0; the cost logged beside
  the reward);
- `staleness.py`: whether a rollout's latency fits an asynchronous trainer's staleness window.

Nothing here imports TRL, torch or transformers: they are the trainer's, not the client's.
"""

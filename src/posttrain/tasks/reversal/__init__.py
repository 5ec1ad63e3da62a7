"""REVERSAL-BENCH on grids: a reversibility axis rho, a reset oracle, a recoverability shield (docs/reversal.md).

grid.py      maps from a seed, the transition function, rendering (pure)
oracle.py    can_reach_goal: BFS over the true transition graph
shield.py    LocalShield: predicts irrecoverable moves from the visible neighbourhood only
gym_env.py   ReversalGridEnv (gymnasium.Env): episodic / reset-free, shield on / off
baselines.py scripted policies (random, greedy) and the bench's episode runner
task.py      the `reversal` task: the gym env through the text adapter (envs/gym_text.py)
"""

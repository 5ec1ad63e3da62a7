import pytest

from posttrain.loop.batch import BatchOptions, build_batch, sequences_from_groups
from posttrain.types import Group, Trajectory, Turn


def _traj(prompt, completion, reward=0.0, failed=False):
    return Trajectory(turns=[Turn(prompt_ids=prompt, completion_ids=completion,
                                  completion_logprobs=[-0.5] * len(completion), policy_version=3)],
                      reward=reward, failed=failed)


def test_multi_turn_sequence_masks_env_tokens():
    t = Trajectory(turns=[Turn([1, 2], [3, 4], [-1.0, -2.0], 0), Turn([1, 2, 3, 4, 9, 9], [5], [-3.0], 1)])
    tokens, mask, logps = t.sequence()
    assert tokens == [1, 2, 3, 4, 9, 9, 5]
    assert mask == [1, 1, 0, 0, 1] and logps == [-1.0, -2.0, 0.0, 0.0, -3.0]
    assert t.policy_version == 0 and t.num_completion_tokens == 3


def test_turn_that_rewrites_history_is_rejected():
    t = Trajectory(turns=[Turn([1, 2], [3], [-1.0], 0), Turn([1, 7, 3], [5], [-3.0], 0)])
    with pytest.raises(ValueError, match="does not extend"):
        t.sequence()


def test_the_batch_path_drops_failed_trajectories():
    g = Group(task_index=0, trajectories_G=[_traj([1], [2], 1.0), _traj([1], [3], 0.0), _traj([1], [4], 0.0, failed=True)])
    b, _ = build_batch(sequences_from_groups([g]), BatchOptions(advantage="grpo", scale_std=False))
    assert [s.completion_ids for s in b.sequences] == [[2], [3]] and b.num_loss_tokens == 2
    assert [round(s.advantage, 6) for s in b.sequences] == [0.5, -0.5] and b.total_seqs == 2.0


def test_trajectory_json_roundtrip():
    t = _traj([1, 2], [3], 0.5)
    assert Trajectory.from_dict(t.to_dict()) == t

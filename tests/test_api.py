"""The library entry point stays callable: `posttrain.train` is a function even after its internals are imported
(a subpackage named `train` once replaced it with a module, so a second call in one process failed)."""

import posttrain


def test_train_is_still_a_function_after_a_run(tmp_path):
    first = posttrain.train(loop__steps=1, model__name="tiny-random", task__name="count-a", loop__eval_every=0,
                            run__output_dir=str(tmp_path), loop__save_every=0, loop__eval_prompts=2)
    import importlib
    importlib.import_module("posttrain.training.trainer")  # what the run imported anyway
    assert callable(posttrain.train)
    second = posttrain.train(loop__steps=1, model__name="tiny-random", task__name="count-a", loop__eval_every=0,
                             run__output_dir=str(tmp_path), loop__save_every=0, loop__eval_prompts=2)
    assert first.run_dir != second.run_dir

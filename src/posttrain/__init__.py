"""posttrain: reinforcement-learning post-training for language models and LLM agents."""

__version__ = "0.1.0"


def train(config=None, **overrides):
    """Run a training job. `config` is a Config, a YAML path, or None (defaults); `overrides` are dotted keys
    with `__` for dots, e.g. train(loop__steps=5, model__name="tiny-random")."""
    from posttrain.config import Config, load_config
    from posttrain.loop import train as _train

    ovs = [f"{k.replace('__', '.')}={v}" for k, v in overrides.items()]
    if isinstance(config, Config):
        from posttrain.config import apply_override, validate

        data = config.model_dump()
        for ov in ovs:
            apply_override(data, ov)
        cfg = validate(data)
    else:
        cfg = load_config(config, ovs)
    return _train(cfg)

"""Running parts of a run on a cluster: rollout sampling on Ray sampler actors (`cluster.backend=ray`) and
sandboxed runs and grading as Ray tasks (`cluster.sandbox=ray`).

    ray_runtime.py     importing Ray (a clear error without it), connecting or starting it, placement groups
    sampler_worker.py  what one sampler actor holds: its own copy of the policy behind an HFSampler
    ray_sampler.py     RaySamplerPool: the `Sampler` protocol over N actors (split, reassemble, replace the dead)
    ray_weights.py     ObjectStoreWeights: the `WeightSync` that puts the trainable state in the object store once
                       per version and has every actor load it
    ray_grading.py     RayGrading: the SandboxPool executor that runs each sandboxed call as a Ray task (spread,
                       timed out, retried when its worker dies)

Nothing here imports Ray at module level: the default (local) backend never starts a Ray process.
"""

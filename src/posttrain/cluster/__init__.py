"""Running parts of a run on a cluster: rollout sampling on Ray sampler actors (`cluster.backend=ray`) and
sandboxed runs and grading as Ray tasks (`cluster.sandbox=ray`).

    ray_runtime.py     importing Ray (a clear error without it), connecting or starting it, placement groups
    sampler_worker.py  what one sampler actor holds: its own copy of the policy behind an HFSampler
    ray_sampler.py     RaySamplerPool: the `Sampler` protocol over N actors (split, reassemble, replace the dead)
    ray_weights.py     the actors' `WeightSync`: MemoryWeights (shared memory to actors on this node, a group
                       broadcast to the others) or ObjectStoreWeights (one `ray.put` a version)
    vllm_servers.py    VLLMServerPool: supervised vLLM servers (sampling, pushes, restarts)
    server_loads.py    how a push reaches those servers: file, shared memory or a group broadcast
    server_processes.py  each server in its own process group under a watchdog
    server_sockets.py  where those servers listen: Unix sockets in a directory only this user can enter
    ray_grading.py     RayGrading: the SandboxPool executor that runs each sandboxed call as a Ray task (spread,
                       timed out, retried when its worker dies)

Nothing here imports Ray at module level: the default (local) backend never starts a Ray process.
"""

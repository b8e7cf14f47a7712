"""The engine: what runs a chain. Layer 2 of docs/architecture.md, below generation, above the contract.

    registry   registry.toml: known plugins and named presets
    discovery  the plugin host: entry points, pluggy, versioned names, broken plugins reported
    config     a chain file (TOML / dict / preset) validated into a ChainConfig
    backends   which backend plugin runs a step (cpu, cuda, mps)
    store      the request store: per-request parameters, seeds, RNG positions, sampler state
    chain      the executor: one sampling step (`Chain.sample`), with `checks` (its inputs, why a step failed)
               and `logprobs` (logprobs at any stage)
    step       what one step holds (`Step`) and returns (`SampleOutput`, `DeferredSample`)
    stages     the stages a step runs on its `Step`: filters with the fusions, contexts, state updates
    mixed      a batch whose rows run different chains
    graphs     a step captured in a CUDA graph per batch-size bucket
    stopping   the stopping criteria of a generation, together

It imports the contract (the top-level modules) and nothing above itself.
"""

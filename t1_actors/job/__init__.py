"""The campaign job: what ``t1-actor launch`` runs, phase by phase.

    main      run_campaign: corpus -> tokenizer -> SFT (version 0) -> the six actors -> summary
    resume    ``launch --resume``: a run killed whole goes on from its log (the config checked, phases 1-3 skipped)
    config    [campaign]: the phases' budgets
    rules     the rules across config sections, run by every load of a run config
    layout    where a run directory keeps its log, tokenizer, weights and checkpoints
    sft       phases 2-3: the run's tokenizer and the SFT warm start, or their reuse from another run
    schedule  the staleness controller's schedule: SFT eval -> warm-up -> RL -> RL eval, and its task orders
    summary   phase 5: summary.json and the plots, from the log alone
    progress  what the terminal shows while a campaign runs
    seeds     N RL seeds from one SFT policy, and their table
"""

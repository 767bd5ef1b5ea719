"""Rules across config sections (and the values one key sets for two), run by every load of a run config (``config.parse_config``): ``launch``,
``check`` and every ``t1-actor ROLE`` refuse the same configs, before any process starts.

Each rule raises ``ValueError`` naming both keys and the fix; ``parse_config`` prefixes the source.
"""

from __future__ import annotations

from pathlib import Path


def learner_temperature(config) -> None:
    """One key: ``[ppo] temperature`` left unset is ``[sampler] temperature`` (the logprobs the sampler stores
    are at its temperature, so the learner's must be too); set, it must equal it (``check_temperatures``)."""
    ppo_cfg = config.section("ppo")
    if "temperature" not in ppo_cfg.model_fields_set:
        config._sections["ppo"] = ppo_cfg.model_copy(update={"temperature": config.section("sampler").temperature})


def check_temperatures(config) -> None:
    """PPO's ratio is only right when the learner takes logprobs at the temperature the sampler stored."""
    sampled, trained = config.section("sampler").temperature, config.section("ppo").temperature
    if sampled != trained:
        raise ValueError(f"[sampler] temperature = {sampled} but [ppo] temperature = {trained}; leave [ppo] temperature "
                         "unset (it follows [sampler] temperature) or set both to the same value (the sampler "
                         "stores logprobs at its temperature)")


def check_groups(config) -> None:
    """A group baseline needs groups: with one trial per task every trajectory would fall back to GAE."""
    estimator, size = config.section("ppo").advantage_estimator, config.section("staleness").group_size
    if estimator == "rloo" and size < 2:
        raise ValueError(f"[ppo] advantage_estimator = 'rloo' but [staleness] group_size = {size}; set "
                         "group_size >= 2 (trials per task) or advantage_estimator = 'gae'")


def check_actor_params(config) -> None:
    """Training part of the policy is the torch learner's: refused before any process starts otherwise."""
    ppo_cfg, backend = config.section("ppo"), config.section("learner").backend
    if ppo_cfg.trains_part_of_policy and backend != "torch":
        raise ValueError(f"[ppo] actor_params = {list(ppo_cfg.actor_params)} but [learner] backend = {backend!r}, "
                         "which trains the whole policy only; use backend = 'torch' or actor_params = ['*']")


def check_sft_passes(config) -> None:
    """SFT passes read from elsewhere need an elsewhere: the run the SFT policy itself comes from."""
    if config.section("eval").sft_passes == "warm_start" and config.section("campaign").warm_start_from is None:
        raise ValueError("[eval] sft_passes = 'warm_start' but [campaign] warm_start_from is not set; name the run "
                         "whose SFT policy (and its eval passes) this run starts from, or set sft_passes = 'run'")


def check_tokenizer(config) -> None:
    """An HF tokenizer directory must be there, whole, before the run starts: the SFT chats, every prompt, the stop
    id and the model's vocabulary all come from it."""
    campaign = config.section("campaign")
    if campaign.tokenizer is None:
        return
    if campaign.warm_start_from is not None:
        raise ValueError(f"[campaign] tokenizer = {campaign.tokenizer!r} but warm_start_from is set, which reuses that "
                         "run's tokenizer (and the policy trained with it); drop one of the two keys")
    directory = Path(campaign.tokenizer)
    missing = [name for name in ("tokenizer.json", "tokenizer_config.json") if not (directory / name).is_file()]
    if missing:
        fetch = " (Qwen3's: run `bash .ci/fetch-qwen3-tokenizer`)" if "qwen3" in directory.name.lower() else ""
        raise ValueError(f"[campaign] tokenizer = {campaign.tokenizer!r}: no {' or '.join(missing)} in "
                         f"{directory.absolute()}; point it at an HF tokenizer directory with both files{fetch}, "
                         "or remove the key to train t1's own BPE")


DERIVED = (learner_temperature,)  # values one key sets for two sections, filled in before the rules run
RULES = (check_temperatures, check_groups, check_actor_params, check_sft_passes, check_tokenizer)


def check_run(config) -> None:
    for derive in DERIVED:
        derive(config)
    for rule in RULES:
        rule(config)

"""The run config's [tasks] section, and the task sets it yields (looked up by id by the actors)."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, model_validator

from t1_actors.tasks.formats import load_tasks
from t1_actors.tasks.model import Split, Task
from t1_actors.tasks.synthetic import generate, generate_composite, generate_nested, generate_recovery


class TasksConfig(BaseModel):
    """Which tasks a run trains and evaluates on. Defaults: the tiny embedded run's synthetic corpus."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = Field(0, description="seed of the synthetic task draws: the same seed and sizes give the same tasks")
    train_size: int = Field(2000, ge=0, description="synthetic train tasks (SFT warm start and RL; see rl_size)")
    eval_size: int = Field(320, ge=0, description="synthetic single-requirement eval tasks (under ~300 a gain of a "
                                                  "few points is noise)")
    families: list[str] | None = Field(None, description="synthetic task families to draw from, taken in turn (a "
                                                         "family named twice is drawn twice as often); None: every "
                                                         "available one")
    task_dirs: list[str] = Field([], description="trees of own / Terminal-Bench / Harbor task directories, added to "
                                                 "the task_dirs_split split")
    task_dirs_split: Split = Field("eval", description="the split the task_dirs tasks join: train (SFT and RL, "
                                                       "never carved out by rl_size) or eval")
    rl_size: int = Field(0, ge=0, description="the last rl_size synthetic train tasks are kept out of the SFT warm "
                                              "start (tokenizer, oracle pool): RL draws only from them; 0 = SFT and "
                                              "RL share the whole train split")

    validation_size: int = Field(0, ge=0, description="synthetic single-requirement tasks of the validation split "
                                                      "(eval-side instructions, disjoint from the eval split): "
                                                      "each policy's best sampling temperature is chosen on it")
    composite_rl: int = Field(0, ge=0, description="composite train tasks (2 parts, pairings RL may see) added to "
                                                   "RL's pool; SFT never sees a composite")
    composite_eval: int = Field(0, ge=0, description="composite tasks added to the eval split (2 parts on held-out "
                                                     "pairings and 3 parts, alternating)")
    composite_validation: int = Field(0, ge=0, description="composite tasks of the validation split, drawn like "
                                                           "the eval split's")
    nested_sft: int = Field(0, ge=0, description="train tasks whose outputs go to an existing subdirectory, added "
                                                 "to the SFT warm start (the recovery tasks' twins, minus the error)")
    nested_mkdir_share: float = Field(0.0, ge=0, le=1, description="share of the nested SFT tasks whose oracle "
                                                                  "first runs the harmless mkdir -p of the directory")
    recovery_rl: int = Field(0, ge=0, description="error-recovery train tasks (outputs in a missing directory; "
                                                  "families RL may see) added to RL's pool; SFT never sees one")
    recovery_eval: int = Field(0, ge=0, description="error-recovery tasks added to the eval split (seen and "
                                                    "held-out families, alternating)")
    recovery_validation: int = Field(0, ge=0, description="error-recovery tasks of the validation split, drawn "
                                                          "like the eval split's")

    @model_validator(mode="after")
    def _check(self) -> TasksConfig:
        if self.rl_size and self.rl_size >= self.train_size:
            raise ValueError(f"[tasks] rl_size = {self.rl_size} leaves no train task for the SFT warm start "
                             f"(train_size = {self.train_size}); make rl_size smaller than train_size")
        return self


@dataclass(frozen=True)
class TaskSets:
    """With ``[tasks] rl_size`` the synthetic train tasks split into ``sft`` and ``rl`` (own train task
    directories belong to both); without it ``sft`` and ``rl`` are the whole ``train`` list.

    Why carve: an SFT policy memorises the tasks it was fitted on (c2: 90-98 % resolved on them at T = 1.0,
    67-73 % on unseen ones), so RL on those tasks sees mostly all-solved groups and no learning signal.
    """

    train: list[Task]
    eval: list[Task]
    by_id: dict[str, Task] = field(default_factory=dict)
    sft: list[Task] = field(default_factory=list)
    rl: list[Task] = field(default_factory=list)
    validation: list[Task] = field(default_factory=list)

    @property
    def carved(self) -> bool:
        """Whether RL has train tasks SFT never saw (``[tasks] rl_size`` > 0, or recovery / composite tasks)."""
        sft = {t.id for t in self.sft}
        return any(t.id not in sft for t in self.rl)

    def get(self, task_id: str) -> Task:
        try:
            return self.by_id[task_id]
        except KeyError:
            raise KeyError(f"unknown task id {task_id!r}; it is in neither the train nor the eval set") from None


def build_task_sets(config: TasksConfig) -> TaskSets:
    """The train and eval task lists the config asks for; task ids are unique across both. The synthetic
    train tasks come in a fixed order by index, so ``rl_size`` carves the same tasks whatever else changes."""
    train = generate("train", config.train_size, seed=config.seed, families=config.families)
    # The validation split continues the eval split's draw: eval-side instructions, none of them in eval.
    single_eval = generate("eval", config.eval_size + config.validation_size, seed=config.seed,
                           families=config.families)
    evaluation, validation = single_eval[: config.eval_size], single_eval[config.eval_size:]
    composite_rl = generate_composite("train", config.composite_rl, seed=config.seed, families=config.families)
    composite_eval = generate_composite("eval", config.composite_eval + config.composite_validation,
                                        seed=config.seed, families=config.families)
    evaluation += composite_eval[: config.composite_eval]
    validation += composite_eval[config.composite_eval:]
    nested = generate_nested("train", config.nested_sft, seed=config.seed, families=config.families,
                             mkdir_share=config.nested_mkdir_share)
    recovery_rl = generate_recovery("train", config.recovery_rl, seed=config.seed, families=config.families)
    recovery_eval = generate_recovery("eval", config.recovery_eval + config.recovery_validation, seed=config.seed,
                                      families=config.families)
    evaluation += recovery_eval[: config.recovery_eval]
    validation += recovery_eval[config.recovery_eval:]
    for root in config.task_dirs:
        loaded = load_tasks(root, split=config.task_dirs_split)
        (train if config.task_dirs_split == "train" else evaluation).extend(loaded)
    by_id: dict[str, Task] = {}
    for task in [*train, *nested, *composite_rl, *recovery_rl, *evaluation, *validation]:
        if task.id in by_id:
            raise ValueError(f"task id {task.id!r} appears twice in the run's task sets; rename one")
        by_id[task.id] = task
    if config.rl_size:  # the carve-out is synthetic only; own train task directories serve both phases
        cut = config.train_size - config.rl_size
        synthetic, loaded = train[: config.train_size], train[config.train_size:]
        sft, rl = synthetic[:cut] + loaded, synthetic[cut:] + loaded
    else:
        sft, rl = list(train), list(train)
    return TaskSets(train=train, eval=evaluation, by_id=by_id, sft=sft + nested, rl=rl + composite_rl + recovery_rl,
                    validation=validation)

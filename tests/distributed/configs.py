"""The small pipeline config the distributed tests run (embedded default policy: it earns mixed rewards, so
GRPO gradients are not zero)."""

from trace_rl.pipelines import default_config


def small_pipeline(steps: int, **extra):
    return default_config().with_overrides({
        "loop.steps": steps, "loop.prompts_per_step": 4, "loop.group_size": 4, "loop.eval_every": 0,
        "loop.eval_prompts": 8, "trainer.micro_batch_size": 4, "logging.progress": False, "logging.plot": False,
        **extra})

"""The pieces of an experiment run: config, prompts, models, methods, results, summary.

`specjax.experiment.run_experiment` puts them together.
"""

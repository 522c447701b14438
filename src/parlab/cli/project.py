"""``parlab project <name>``: the project runners, one sub-command per project.

This module only creates the shared sub-app and registers it on ``parlab``;
each area adds its own sub-command from its own module::

    from parlab.cli.project import project_app

    @project_app.command("model-internal")
    def model_internal_cmd(...): ...
"""

from __future__ import annotations

import typer

from parlab.cli import app

project_app = typer.Typer(
    name="project",
    help="The project runners: each runs its comparison set and renders its report "
    "(training-state, model-internal, moe, serving, ...).",
    no_args_is_help=True,
)
app.add_typer(project_app, name="project")

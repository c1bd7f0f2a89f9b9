"""``meshctl completion SHELL``: the script that makes a shell complete meshctl's words.

The script calls ``meshctl`` back with ``_MESHCTL_COMPLETE`` set on every <TAB>; the root command
answers from the same command tree ``--help`` shows (plugins load lazily, so a subcommand's
options are completed once its word is typed). typer's own scripts and shell classes do both
halves; this module only prints the script, with how to install it in the help.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

import typer

from meshctl import options

Shell = Literal["bash", "zsh", "fish", "powershell"]
SHELLS = get_args(Shell)
PROG_NAME = "meshctl"
COMPLETE_VAR = "_MESHCTL_COMPLETE"  # the root command reads the same name (meshctl.cli)

app = options.command_app()


@app.command()
def completion(
    shell: Annotated[
        Shell, typer.Argument(metavar="SHELL", help="The shell to complete in.", show_default=False)
    ],
    output_file: options.OutputFileOption = None,
) -> None:
    """Print the completion script for SHELL; load it once per shell session, or install it:

    \b
      bash:        source <(meshctl completion bash)
                   (or: meshctl completion bash > /etc/bash_completion.d/meshctl)
      zsh:         meshctl completion zsh > "${fpath[1]}/_meshctl"   (then: compinit)
      fish:        meshctl completion fish > ~/.config/fish/completions/meshctl.fish
      powershell:  meshctl completion powershell | Out-String | Invoke-Expression
    """
    from typer._completion_shared import get_completion_script  # typer's scripts, pinned minor

    script = get_completion_script(prog_name=PROG_NAME, complete_var=COMPLETE_VAR, shell=shell)
    options.write_output(script + "\n", output_file)

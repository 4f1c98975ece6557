from specdecode.cli import main
from specdecode.cli_args import run_command

run_command(main)

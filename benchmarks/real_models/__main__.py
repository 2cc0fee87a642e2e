"""`python -m benchmarks.real_models`: see `benchmarks.real_models.command`."""

import tensorflow as tf

from benchmarks.real_models.command import main

tf.get_logger().setLevel("ERROR")
main()

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_keras_state():
    """Each test starts from the float32 policy, a fixed seed and fresh layer names.

    Without a full garbage collection (`free_memory=False`): in a worker that
    has built hundreds of models, one took 2.4 s on average, 15 minutes of the
    suite's worker time; Python's own collector still frees what tests leave.
    """
    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session(free_memory=False)
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy("float32")


# Tests whose models take minutes to trace, compile or train on 2 cores, in
# order of their cost (with two workers, ResNet50V2's bit-identity test took
# 178 s, MobileNetV2's 147 s, the demo in a fresh environment 125 s).
LONGEST = (
    "resnet50_v2",
    "mobilenet_v2",
    "vgg16",
    "tests/test_real_models.py",
    "tests/test_keras_hub_language_tasks.py",
    "fresh_environment",
)


def pytest_collection_modifyitems(items):
    """Runs the longest tests first. `scripts/test.sh` hands each pytest-xdist
    worker one test at a time (`--maxschedchunk 1`), so a worker that is free
    takes the next test: started first, the long tests spread over both
    workers instead of ending the run on one while the other waits (the suite
    took 36 minutes so, with one worker idle for most of the last 20)."""

    def cost_rank(item):
        found = [i for i, name in enumerate(LONGEST) if name in item.nodeid]
        return found[0] if found else len(LONGEST) + (item.get_closest_marker("slow") is None)

    items.sort(key=cost_rank)  # stable: the order within a rank stays

"""The detection benchmark's geometry, matcher, loss and metric against hand-computed
values (no training)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.detection import canvases, geometry, metric, plan, report, ssd
from benchmarks.detection.plan import Run


def test_iou_against_hand_computed_overlaps():
    a = np.array([[0.0, 0.0, 2.0, 2.0], [0.0, 0.0, 4.0, 4.0]])
    b = np.array([[1.0, 1.0, 3.0, 3.0], [5.0, 5.0, 6.0, 6.0], [0.0, 0.0, 2.0, 2.0]])
    # (0,0,2,2) vs (1,1,3,3): 1 / (4 + 4 - 1); (1,1,3,3) inside (0,0,4,4): 4 / 16.
    np.testing.assert_allclose(geometry.iou(a, b), [[1 / 7, 0.0, 1.0], [0.25, 0.0, 0.25]])
    assert geometry.iou(a, np.zeros((0, 4))).shape == (2, 0)


def test_encoding_against_hand_computed_offsets():
    anchor = np.array([[0.5, 0.5, 0.2, 0.4]])  # centre form
    # Centre (0.49, 0.5), size (0.4, 0.2): twice as wide, half as tall as the anchor.
    box = np.array([[0.29, 0.4, 0.69, 0.6]])
    expected = [[-0.01 / (0.2 * 0.1), 0.0, math.log(2) / 0.2, math.log(0.5) / 0.2]]
    np.testing.assert_allclose(geometry.encode(box, anchor), expected, atol=1e-12)
    np.testing.assert_allclose(expected[0][:2], [-0.5, 0.0])
    np.testing.assert_allclose(geometry.decode(np.array(expected), anchor), box, atol=1e-12)


def test_encode_then_decode_is_the_identity():
    rng = np.random.default_rng(0)
    corners = rng.uniform(0, 0.5, (50, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(0.05, 0.5, (50, 2))], axis=1)
    anchors = geometry.anchors()[rng.integers(0, len(geometry.anchors()), 50)]
    decoded = geometry.decode(geometry.encode(boxes, anchors), anchors)
    np.testing.assert_allclose(decoded, boxes, atol=1e-12)


def test_default_boxes_follow_the_feature_maps_in_head_order():
    boxes = geometry.anchors()
    assert boxes.shape == (12 * 12 * 4 + 6 * 6 * 4, 4)
    s = 0.2
    np.testing.assert_allclose(
        boxes[:4],
        [
            [1 / 24, 1 / 24, s, s],
            [1 / 24, 1 / 24, math.sqrt(0.2 * 0.35), math.sqrt(0.2 * 0.35)],
            [1 / 24, 1 / 24, s * math.sqrt(2), s / math.sqrt(2)],
            [1 / 24, 1 / 24, s / math.sqrt(2), s * math.sqrt(2)],
        ],
    )
    np.testing.assert_allclose(boxes[4, :2], [3 / 24, 1 / 24])  # next column, same row
    np.testing.assert_allclose(boxes[12 * 4, :2], [1 / 24, 3 / 24])  # next row
    np.testing.assert_allclose(boxes[576], [1 / 12, 1 / 12, 0.35, 0.35])  # second map


QUADRANTS = np.array(
    [
        [0.25, 0.25, 0.5, 0.5],  # corners (0, 0, .5, .5)
        [0.75, 0.25, 0.5, 0.5],  # (.5, 0, 1, .5)
        [0.25, 0.75, 0.5, 0.5],  # (0, .5, .5, 1)
        [0.75, 0.75, 0.5, 0.5],  # (.5, .5, 1, 1)
        [0.5, 0.5, 1.0, 1.0],  # the whole canvas
        [0.75, 0.75, 0.4, 0.4],  # (.55, .55, .95, .95)
    ]
)


def test_matcher_thresholds_and_forces_each_box_best_anchor():
    boxes = np.array(
        [
            [0.0, 0.0, 0.5, 0.5],  # = anchor 0
            [0.5, 0.5, 0.9, 0.9],  # IoU .64 with anchor 3 (best), .62 with anchor 5
            [0.5, 0.0, 0.6, 0.2],  # IoU .08 with anchor 1 at best: forced
        ]
    )
    targets = geometry.match(boxes, np.array([3, 7, 1]), QUADRANTS)
    # Anchor 4 overlaps box 0 by .25 at most: background. Anchor 2 overlaps nothing.
    np.testing.assert_array_equal(targets[:, 0], [4, 2, 0, 8, 0, 8])
    np.testing.assert_allclose(targets[0, 1:], [0, 0, 0, 0], atol=1e-6)
    # Box 1: centre (.7, .7), side .4 against anchor 3's (.75, .75), .5.
    np.testing.assert_allclose(
        targets[3, 1:], [-1.0, -1.0, math.log(0.8) / 0.2, math.log(0.8) / 0.2], rtol=1e-6
    )
    # Box 2: centre (.55, .1), size (.1, .2) against anchor 1's (.75, .25), .5.
    np.testing.assert_allclose(
        targets[1, 1:], [-4.0, -3.0, math.log(0.2) / 0.2, math.log(0.4) / 0.2], rtol=1e-6
    )
    np.testing.assert_array_equal(targets[[2, 4], 1:], 0.0)
    np.testing.assert_allclose(targets[5, 1:3], [-0.05 / 0.04, -0.05 / 0.04], rtol=1e-6)


def test_matcher_gives_a_shared_best_anchor_to_the_later_box():
    anchors = QUADRANTS[[0, 4]]
    boxes = np.array([[0.0, 0.0, 0.4, 0.4], [0.1, 0.1, 0.5, 0.5]])  # both IoU .64 with anchor 0
    targets = geometry.match(boxes, np.array([2, 5]), anchors)
    np.testing.assert_array_equal(targets[:, 0], [6, 0])
    assert geometry.match(np.zeros((0, 4)), np.zeros(0, int), anchors).sum() == 0


def _targets(labels, offsets=None):
    labels = np.asarray(labels, np.float32)
    offsets = np.zeros(labels.shape + (4,), np.float32) if offsets is None else offsets
    return np.concatenate([labels[..., None], offsets], axis=-1).astype(np.float32)


def test_hard_negative_mining_keeps_the_largest_losses_three_per_positive():
    labels = tf.constant([[1, 0, 0, 0, 0, 0, 0], [2, 2, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0]])
    losses = tf.constant(
        [
            [9.0, 0.5, 3.0, 0.1, 4.0, 2.0, 1.0],  # 3 kept: 4.0, 3.0, 2.0
            [0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0],  # min(6, 5): every background anchor
            [5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0],  # no positive: none
        ]
    )
    mined = ssd.hard_negatives(labels, losses).numpy()
    np.testing.assert_array_equal(
        mined,
        [
            [False, False, True, False, True, True, False],
            [False, False, True, True, True, True, True],
            [False] * 7,
        ],
    )
    # Equal losses: the lower anchor index first.
    ties = ssd.hard_negatives(tf.constant([[0, 0, 1, 0, 0, 0]]), tf.constant([[1.0] * 6]))
    np.testing.assert_array_equal(ties.numpy(), [[True, True, False, True, False, False]])


def _log_sum_exp(values):
    return math.log(sum(math.exp(v) for v in values))


def test_multibox_loss_against_a_hand_computed_value():
    # One image, 6 anchors, classes (background, a, b). Anchor 0 is class a.
    # Background anchors' logits (0, x, 0): cross-entropy log(2 + e^x).
    xs = [0.0, 2.0, -1.0, 3.0, 1.0]
    logits = np.array([[0.0, 0.0, 0.0]] + [[0.0, x, 0.0] for x in xs], np.float32)
    offsets = np.full((6, 4), 10.0, np.float32)  # background offsets never count
    offsets[0] = [0.5, -2.0, 0.0, 1.0]
    y_pred = np.concatenate([logits, offsets], axis=-1)[None]
    y_true = _targets([[1, 0, 0, 0, 0, 0]])
    y_true[0, 0, 1:] = [0.0, 0.0, 0.0, 0.0]
    # Positive: log 3. Mined: 3 x 1 negatives with the largest losses, x = 3, 2, 1.
    confidence = math.log(3) + sum(math.log(2 + math.exp(x)) for x in (3.0, 2.0, 1.0))
    location = 0.5 * 0.5**2 + (2.0 - 0.5) + 0.0 + (1.0 - 0.5)  # smooth L1: 0.125 + 1.5 + 0.5
    assert location == 2.125
    value = float(ssd.multibox_loss(tf.constant(y_true), tf.constant(y_pred)))
    assert value == pytest.approx(confidence + location, rel=1e-6)


def test_multibox_loss_normalises_by_the_positives_of_the_whole_batch():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 3))
    offsets = rng.normal(size=(2, 5, 4))
    true_offsets = rng.normal(size=(2, 5, 4)).astype(np.float32)
    labels = np.array([[2, 0, 0, 0, 0], [1, 2, 0, 0, 0]])
    y_pred = np.concatenate([logits, offsets], axis=-1).astype(np.float32)
    y_true = _targets(labels, true_offsets)

    def ce(image, anchor):
        row = logits[image, anchor]
        return _log_sum_exp(row) - row[labels[image, anchor]]

    def smooth(d):
        return np.where(np.abs(d) < 1, 0.5 * d**2, np.abs(d) - 0.5).sum()

    total = 0.0
    # Image 0: 1 positive, 3 of 4 negatives by loss; image 1: 2 positives, all 3 negatives.
    negatives0 = sorted(range(1, 5), key=lambda a: -ce(0, a))[:3]
    for image, anchors in ((0, [0, *negatives0]), (1, [0, 1, 2, 3, 4])):
        total += sum(ce(image, a) for a in anchors)
    for image, anchor in ((0, 0), (1, 0), (1, 1)):
        total += smooth(offsets[image, anchor] - true_offsets[image, anchor])
    value = ssd.multibox_loss(tf.constant(y_true), tf.constant(y_pred))
    assert float(value) == pytest.approx(total / 3, rel=1e-5)
    compiled = tf.function(ssd.multibox_loss, jit_compile=True)
    assert float(compiled(tf.constant(y_true), tf.constant(y_pred))) == pytest.approx(
        total / 3, rel=1e-5
    )


def test_multibox_loss_of_an_all_background_batch_is_not_divided_by_zero():
    y_pred = np.zeros((1, 4, 7), np.float32)
    assert float(ssd.multibox_loss(tf.constant(_targets([[0, 0, 0, 0]])), y_pred)) == 0.0


def test_nms_suppresses_only_by_kept_boxes():
    boxes = np.array(
        [
            [0.0, 0.0, 1.0, 1.0],  # IoU .5 with box 4: suppressed
            [0.0, 0.0, 1.0, 0.9],  # IoU .4 with box 4: kept (box 0 no longer counts)
            [0.0, 0.0, 1.0, 0.5],  # IoU .56 with box 1: suppressed
            [2.0, 2.0, 3.0, 3.0],  # far away: kept
            [0.0, 0.5, 1.0, 1.0],  # best score
        ]
    )
    kept = metric.nms(boxes, np.array([0.9, 0.8, 0.7, 0.6, 0.95]))
    np.testing.assert_array_equal(kept, [4, 1, 3])


def test_average_precision_against_hand_computed_areas():
    scores = [0.6, 0.9, 0.7, 0.8]  # order: hit, miss, hit, miss
    hits = [0, 1, 1, 0]
    # Recall 1/2, 1/2, 1, 1 at precision 1, 1/2, 2/3, 1/2: envelope 1 then 2/3.
    assert metric.average_precision(scores, hits, 2) == pytest.approx(0.5 + 0.5 * 2 / 3)
    # A third object never found: recall steps of 1/3.
    assert metric.average_precision(scores, hits, 3) == pytest.approx(1 / 3 + 1 / 3 * 2 / 3)
    # Miss, hit, hit: precision 0, 1/2, 2/3 rises, so the envelope is 2/3 at both recalls.
    assert metric.average_precision([0.9, 0.8, 0.7], [0, 1, 1], 2) == pytest.approx(2 / 3)
    assert metric.average_precision([0.5, 0.4], [1, 1], 2) == 1.0
    assert metric.average_precision([0.5], [0], 2) == 0.0


def test_mean_average_precision_on_hand_made_detections():
    a, b, c = [0.1, 0.1, 0.3, 0.3], [0.6, 0.6, 0.9, 0.9], [0.5, 0.5, 0.8, 0.8]
    boxes = [np.array([a, c]), np.array([b])]
    labels = [np.array([1, 4]), np.array([1])]
    detections = [
        (
            np.array([a, [0.2, 0.2, 0.4, 0.4], c, c]),  # the second overlaps a by 1/7
            np.array([1, 1, 4, 4]),
            np.array([0.9, 0.8, 0.95, 0.5]),  # c twice: the second is a duplicate
        ),
        (np.array([b, b]), np.array([1, 2]), np.array([0.7, 0.6])),  # 2: no ground truth
    ]
    mean, aps = metric.mean_average_precision(detections, boxes, labels)
    # Class 1: hit, miss, hit over 2 objects = 5/6; class 4: hit then duplicate = 1.
    assert aps[1] == pytest.approx(5 / 6) and aps[4] == 1.0
    assert all(math.isnan(aps[k]) for k in (0, 2, 3, 5, 6, 7, 8, 9))
    assert mean == pytest.approx((5 / 6 + 1) / 2)
    perfect = [(bx, lb, np.ones(len(lb))) for bx, lb in zip(boxes, labels)]
    assert metric.mean_average_precision(perfect, boxes, labels)[0] == 1.0


def _small_split(seed, count=12):
    from sklearn.datasets import load_digits

    data = load_digits()
    return canvases.make_split(data.images[:40] / 16.0, data.target[:40], count, seed)


def test_outputs_that_reproduce_the_targets_detect_every_object():
    data = _small_split(0)
    labels = data.targets[..., 0].astype(int)
    logits = np.where(np.arange(11) == labels[..., None], 10.0, -10.0)
    outputs = np.concatenate([logits, data.targets[..., 1:]], axis=-1)
    mean, _ = metric.mean_average_precision(metric.detect(outputs), data.boxes, data.labels)
    assert mean == pytest.approx(1.0)


def test_the_data_generator_is_deterministic_for_a_seed():
    first, again, other = _small_split(3), _small_split(3), _small_split(4)
    np.testing.assert_array_equal(first.images, again.images)
    np.testing.assert_array_equal(first.targets, again.targets)
    for x, y in zip(first.boxes + first.labels, again.boxes + again.labels):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(first.images, other.images)
    assert first.images.shape == (12, canvases.CANVAS, canvases.CANVAS, 1)
    for boxes, labels, targets in zip(first.boxes, first.labels, first.targets):
        assert 1 <= len(labels) <= 3 and boxes.shape == (len(labels), 4)
        assert np.all((boxes >= 0) & (boxes <= 1)) and np.all(boxes[:, 2:] > boxes[:, :2])
        assert set(targets[:, 0][targets[:, 0] > 0] - 1) <= set(labels)


def test_splits_paste_disjoint_digit_images():
    ranges = sorted(canvases.DIGIT_POOLS.values())
    assert all(stop <= start for (_, stop), (start, _) in zip(ranges, ranges[1:]))


def test_resize_is_bilinear_with_half_pixel_centres():
    np.testing.assert_allclose(
        canvases.resize(np.array([[0.0, 1.0], [0.0, 1.0]]), 2, 4),
        [[0.0, 0.25, 0.75, 1.0]] * 2,
    )
    image = np.random.default_rng(0).random((8, 8))
    np.testing.assert_allclose(canvases.resize(image, 8, 8), image)


def test_l2_normalisation_scales_each_location_to_twenty():
    layer = ssd.L2Normalization(20.0)
    out = layer(np.array([[[[3.0, 4.0]]]], np.float32))
    np.testing.assert_allclose(out.numpy(), [[[[12.0, 16.0]]]], rtol=1e-6)
    clone = ssd.L2Normalization.from_config(layer.get_config())
    assert (clone.initial_scale, clone.epsilon) == (20.0, 1e-10)


def test_batch_order_is_a_fixed_permutation_per_pass():
    order = plan.batch_order(5, steps=7, batch=4, count=10)
    assert order.shape == (7, 4)
    np.testing.assert_array_equal(np.sort(order.ravel()[:10]), np.arange(10))
    np.testing.assert_array_equal(order, plan.batch_order(5, 7, 4, 10))


def _run(method, seed, value, optimizer="sgd"):
    return Run(optimizer, method, seed, 1e-3, value, [], 1.0, [], 10, 0, 0, True, 1.0, 1.0, 1.0)


def test_paired_differences_are_by_seed_with_standard_errors():
    runs = [_run("keras_lso", s, v) for s, v in enumerate([0.50, 0.60, 0.70])]
    runs += [_run("als_max_safe", s, v) for s, v in enumerate([0.51, 0.63, 0.70])]
    runs += [_run("als_max_safe", 0, 0.0, optimizer="adam")]  # another block: ignored
    mean, error, seeds = report.paired(runs, "sgd", "als_max_safe", "keras_lso")
    # Differences 1, 3, 0 points: mean 4/3, sd sqrt(7/3), s.e. sd / sqrt(3).
    assert seeds == 3 and mean == pytest.approx(4 / 3)
    assert error == pytest.approx(math.sqrt(7 / 3) / math.sqrt(3))
    assert "| sgd | als_max_safe | 61.33 ± 9.61 | +1.33 ± 0.88 |" in report.table(runs)


def test_warm_up_is_linear_then_constant():
    schedule = plan.WarmUp(0.01, steps=100)
    values = [float(schedule(step)) for step in (0, 49, 99, 500)]
    np.testing.assert_allclose(values, [1e-4, 5e-3, 1e-2, 1e-2], rtol=1e-6)
    assert plan.WarmUp.from_config(schedule.get_config()).steps == 100

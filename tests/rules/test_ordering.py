"""The ordered receive's scan sizes (issue 36): what a first pass reads for the room it has, from the
share of free messages the subscription's last receives found."""

from redelivery.rules.ordering import MAX_ORDERED_SCAN, first_scan, next_free_share, next_scan


def test_a_first_pass_reads_the_room_and_a_sixteenth_when_keys_are_free():
    assert first_scan(500) == 531  # not 2,000 (four times the batch: three probes in four for nothing)
    assert first_scan(10) == 26
    assert first_scan(20_000) == MAX_ORDERED_SCAN


def test_a_first_pass_plans_for_the_busy_keys_the_last_one_met():
    assert first_scan(500, 0.5) == 1_031
    assert first_scan(500, 0.0) == first_scan(500, 0.05) == 10_031  # at most twenty times the room
    assert next_scan(531) == 1_062 and next_scan(15_000) == MAX_ORDERED_SCAN


def test_the_share_follows_what_a_first_pass_found():
    assert next_free_share(1.0, 250, 531, filled=False) == 250 / 531  # it read all it could
    assert next_free_share(0.5, 500, 1_031, filled=True) == 0.625  # filled: keys come free again
    assert next_free_share(0.9, 500, 531, filled=True) == 1.0
    assert next_free_share(1.0, 0, 531, filled=False) == 0.05

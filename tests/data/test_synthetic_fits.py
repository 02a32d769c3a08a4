"""A generated population too big for memory is refused by name before any draw."""

from __future__ import annotations

import pytest

from fedveil.data.synthetic import generate_synthetic


def test_a_population_that_would_not_fit_is_refused_before_generating():
    with pytest.raises(ValueError, match=r"num_clients=1000000 .* GiB to generate") as err:
        generate_synthetic(num_clients=1_000_000, memory_budget=8 * 2**30)
    assert "data.num_clients" in str(err.value) and "8.0 GiB available" in str(err.value)


def test_a_population_that_fits_is_generated_as_before():
    data = generate_synthetic(num_clients=5, seed=3, memory_budget=2**30)
    again = generate_synthetic(num_clients=5, seed=3)
    assert (data.x_train == again.x_train).all() and len(data.train_partition) == 5

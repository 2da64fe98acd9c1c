"""One error, located once as data, named by each front end its own way (no text rewriting)."""

from __future__ import annotations

from mmencode.app.api.openai.router import EMBEDDINGS_LOCATOR
from mmencode.app.engine.errors import InvalidImage, ItemLocation, PartialPrecomputed
from mmencode.app.http.errors import error_object
from mmencode.app.http.locators import ENCODE_LOCATOR
from mmencode.app.peers.sglang.protocol import SGLANG_LOCATOR


def test_an_item_error_is_named_by_each_front_end() -> None:
    error = InvalidImage("not a recognised image format").at_item(2, ("image",))
    named = {
        name: error_object(error, "rid", locator)
        for name, locator in (
            ("encode", ENCODE_LOCATOR),
            ("embeddings", EMBEDDINGS_LOCATOR),
            ("sglang", SGLANG_LOCATOR),
        )
    }
    assert {name: (obj["param"], obj["message"]) for name, obj in named.items()} == {
        "encode": ("items[2].image", "item 2: not a recognised image format"),
        "embeddings": ("input[2]", "input[2]: not a recognised image format"),
        "sglang": ("mm_items[2].url", "mm_items[2]: not a recognised image format"),
    }
    assert all(obj["details"] == {"index": 2} for obj in named.values())
    assert error.message == "not a recognised image format"  # rendering changed nothing


def test_the_layer_that_raised_keeps_its_field() -> None:
    error = InvalidImage("x", location=ItemLocation(1, ("metadata", "num_patches"))).at_item(4, ("image",))
    assert error_object(error, None)["param"] == "items[1].metadata.num_patches"
    assert error_object(error, None, SGLANG_LOCATOR)["param"] == "mm_items[1].metadata.num_patches"
    hashed = InvalidImage("mismatch", location=ItemLocation(0, ("hash",)))
    assert error_object(hashed, None, SGLANG_LOCATOR)["param"] == "mm_items[0].content_hash"


def test_a_message_about_several_items_is_left_as_it_is() -> None:
    error = PartialPrecomputed(
        "items [0] carry precomputed embeddings but items [1] do not",
        location=ItemLocation(1, ("precomputed_embedding",), named_in_message=True),
        details={"precomputed": [0], "missing": [1]},
    )
    rendered = error_object(error, None)
    assert rendered["message"] == error.message
    assert rendered["param"] == "items[1].precomputed_embedding"
    assert rendered["details"] == {"precomputed": [0], "missing": [1]}


def test_an_error_about_the_items_as_a_whole_names_the_collection() -> None:
    whole = InvalidImage("65 items", location=ItemLocation(None, ()))
    assert error_object(whole, None, EMBEDDINGS_LOCATOR)["param"] == "input"
    assert error_object(whole, None)["param"] == "items"
    assert error_object(whole, None)["message"] == "65 items"
    assert error_object(InvalidImage("no location"), None)["param"] is None

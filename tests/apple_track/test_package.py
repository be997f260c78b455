import importlib

from shared.model import ModelArgs


def test_package_imports_and_its_model_preset_exists():
    # The track exports the shared transformer; its small preset must exist for it to build on.
    module = importlib.import_module("apple_track")
    assert "on-device" in module.__doc__
    assert ModelArgs.from_preset("tiny").num_params() == 139_584

"""Configuration: one validator for run configs, service settings and deploy settings.

Every setting is a dataclass field declared with `spec(...)` (validator.py) and read by
the same code, so every error names the field, the value and the limit. Run configs
(run.py) are the documented user API: `fedveil.config.RunConfig`, `load_config`.
"""

from fedveil.config.deploy_settings import DeploySettings
from fedveil.config.device import device_config, device_toml
from fedveil.config.run import (
    config_from_dict,
    field_help,
    load_config,
    parse_client_ids,
    parse_stage_dropout,
    set_dotted,
    to_toml,
    toml_text,
)
from fedveil.config.run_schema import (
    SECTIONS,
    ClientConfig,
    DataConfig,
    DpSection,
    EvalConfig,
    ModelConfig,
    RunConfig,
    SecAggSection,
    ServerConfig,
    SimulationConfig,
)
from fedveil.config.service_settings import SERVICE_SECTIONS, ServiceConfig, service_config
from fedveil.config.validator import ConfigError, build, check_range, coerce, help_of, spec

__all__ = [
    "SECTIONS",
    "SERVICE_SECTIONS",
    "ClientConfig",
    "ConfigError",
    "DataConfig",
    "DeploySettings",
    "DpSection",
    "EvalConfig",
    "ModelConfig",
    "RunConfig",
    "SecAggSection",
    "ServerConfig",
    "ServiceConfig",
    "SimulationConfig",
    "build",
    "check_range",
    "coerce",
    "config_from_dict",
    "device_config",
    "device_toml",
    "field_help",
    "help_of",
    "load_config",
    "parse_client_ids",
    "parse_stage_dropout",
    "service_config",
    "set_dotted",
    "spec",
    "to_toml",
    "toml_text",
]

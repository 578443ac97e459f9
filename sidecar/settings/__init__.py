"""Where each `effectd serve` setting comes from: flags win over `EFFECTD_*`
environment variables, which win over the TOML file named by `--config` (or
`EFFECTD_CONFIG`), which wins over the defaults of `ServeConfig`. One table
(`table.SETTINGS`) names every setting once; the flags (`arguments`), the
variables and file keys (`layers`), the error labels and `--print-config`
(`printing`) are all derived from it, so no layer can forget a setting.

An invalid setting raises `sidecar.config.ConfigError`, whose fields name the
setting and where its value came from; `label` names the settings of an error
raised later (while the daemon starts) the same way.
"""

from sidecar.config import ConfigError as ConfigError
from sidecar.config import Layer as Layer
from sidecar.config import Source as Source
from sidecar.settings.arguments import EPILOG as EPILOG
from sidecar.settings.arguments import add_arguments as add_arguments
from sidecar.settings.layers import ConfigFile as ConfigFile
from sidecar.settings.layers import Resolved as Resolved
from sidecar.settings.layers import label as label
from sidecar.settings.layers import load as load
from sidecar.settings.layers import resolve as resolve
from sidecar.settings.printing import MASK as MASK
from sidecar.settings.printing import render as render
from sidecar.settings.table import BY_KEY as BY_KEY
from sidecar.settings.table import CONFIG_ENV as CONFIG_ENV
from sidecar.settings.table import ENV_PREFIX as ENV_PREFIX
from sidecar.settings.table import SETTINGS as SETTINGS
from sidecar.settings.table import Kind as Kind
from sidecar.settings.table import Setting as Setting
from sidecar.settings.values import format_size as format_size
from sidecar.settings.values import parse_size as parse_size

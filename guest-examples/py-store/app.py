"""py-store: a Berth remote snapshot client in Python (componentize-py).

Same behaviour as the Rust fs-store: archives at <root>/<id>.tar in a
directory the host preopened, uploads written under <root>/.partial/ and
renamed into place only when complete. The implementation of the exported
`client` resource lives in remote_client.py, as componentize-py expects.
"""

from wit_world import exports


class RemoteClient(exports.RemoteClient):
    pass

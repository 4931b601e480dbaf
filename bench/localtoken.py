"""The local token of ppnode nodes without credentials (SECURITY.md): the
benches' HTTP calls send it, read from where `ppnode join` makes it."""
import os
import urllib.request


def token_file():
    """PPNODE_TOKEN_FILE, else http-token in the user's state directory."""
    if os.environ.get("PPNODE_TOKEN_FILE"):
        return os.environ["PPNODE_TOKEN_FILE"]
    base = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "ppnode", "http-token")


def urlopen(req, **kw):
    """urllib.request.urlopen with the token, if there is one yet."""
    if isinstance(req, str):
        req = urllib.request.Request(req)
    try:
        with open(token_file()) as f:
            req.add_header("Authorization", "Bearer " + f.read().strip())
    except FileNotFoundError:
        pass
    return urllib.request.urlopen(req, **kw)

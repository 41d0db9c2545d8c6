# The `helm test` check: the manager answers on its metrics endpoint with its
# own metrics. Everything it needs comes from the environment, never from the
# script text: METRICS_URL, METRICS_SCHEME (https sends the Pod's
# ServiceAccount token, TOKEN_FILE, which the manager reviews) and METRIC, a
# metric every manager exposes. test/chart runs this same script against a
# real manager.
set -eu
if [ "$METRICS_SCHEME" = https ]; then
  # The manager's certificate is self-signed; the token authenticates us.
  set -- --insecure --oauth2-bearer "$(cat "$TOKEN_FILE")"
fi
body=$(curl --fail --silent --show-error --max-time 10 --retry 6 --retry-delay 5 --retry-all-errors "$@" "$METRICS_URL")
case "$body" in
  *"$METRIC"*) echo "The manager serves $METRIC at $METRICS_URL." ;;
  *) echo "The manager answered at $METRICS_URL, without $METRIC." >&2; exit 1 ;;
esac

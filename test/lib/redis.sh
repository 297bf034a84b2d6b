# Shared by the tests that run a private Redis on the loopback interface
# (sourced). The network-namespace tests start theirs inside a namespace,
# bound to a private link's address, and do not use this.
#
# start_loopback_redis SERVER DIR: starts SERVER (redis-server) on a free
# port of 127.0.0.1 without persistence, its pid in DIR/redis.pid and its
# log in DIR/redis.log, waits until it answers PING, and sets REDIS_PORT.
# Returns 1 with a message when it does not answer within 10 s.
start_loopback_redis() {
  local server=$1 dir=$2
  REDIS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$server" --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
  for _ in $(seq 100); do
    [[ -s $dir/redis.pid ]] && redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "redis-server on 127.0.0.1:$REDIS_PORT did not answer PING within 10 s ($dir/redis.log)" >&2
  return 1
}

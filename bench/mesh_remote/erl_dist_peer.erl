%% The Erlang distribution peer of bench_mesh_remote.c: two BEAM nodes on this host (erl +S 2
%% each) joined by Erlang distribution over tcp loopback, the same two workloads, printed as
%% "name value". run.sh starts node B, then node A, which measures and halts (B halts with it):
%%   erl +S 2 -name B@127.0.0.1 ... -noinput -pa DIR -s erl_dist_peer serve
%%   erl +S 2 -name A@127.0.0.1 ... -noshell -pa DIR -s erl_dist_peer main B@127.0.0.1
-module(erl_dist_peer).
-export([serve/0, main/1]).

-define(WARM_N, 1000).
-define(RTT_N, 20000).
-define(STREAM_N, 2000000).

now_ns() -> erlang:monotonic_time(nanosecond).

%% Node B: an echo and a counter, registered; the node halts when node A goes away.
serve() ->
    register(echo, spawn(fun echo/0)),
    register(counter, spawn(fun counter/0)),
    spawn(fun() -> net_kernel:monitor_nodes(true), receive {nodedown, _} -> halt(0) end end).

echo() -> receive {From, T} -> From ! T, echo() end.

counter() -> receive {count, From, N} -> count(N), From ! {counted, N}, counter() end.
count(0) -> ok;
count(N) -> receive <<_:128>> -> count(N - 1) end.

%% Node A: finds B's echo and counter (waiting up to 10 s for B), measures, prints, halts;
%% halts with an error if node B goes away before.
main([B]) ->
    Echo = whereis_at(B, echo, 200),
    Counter = whereis_at(B, counter, 200),
    spawn(fun() -> watch(B) end),
    io:format("erl_dist_rtt_us ~.1f~n", [rtt(Echo)]),
    io:format("erl_dist_msgs_per_s ~b~n", [round(stream(Counter))]),
    halt(0).

whereis_at(B, _, 0) -> fail("node ~s not up", B);
whereis_at(B, Name, Tries) ->
    case net_adm:ping(B) =:= pong andalso rpc:call(B, erlang, whereis, [Name]) of
        P when is_pid(P) -> P;
        _ -> timer:sleep(50), whereis_at(B, Name, Tries - 1)
    end.

watch(B) -> monitor_node(B, true), receive {nodedown, B} -> fail("node ~s down", B) end.

fail(Fmt, B) -> io:format(standard_error, "erl_dist_peer: " ++ Fmt ++ "~n", [B]), halt(1).

%% {self(), I} to the echo, one in flight: p50 of RTT_N round trips (us) after WARM_N.
rtt(Echo) ->
    [ping(Echo, I) || I <- lists:seq(1, ?WARM_N)],
    Ts = lists:sort([ping(Echo, I) || I <- lists:seq(1, ?RTT_N)]),
    lists:nth(?RTT_N div 2 + 1, Ts) / 1000.

ping(Echo, I) ->
    T0 = now_ns(),
    Echo ! {self(), I},
    receive I -> now_ns() - T0 end.

%% STREAM_N 16-byte binaries to the counter with plain `!` (busy distribution buffer suspends
%% the sender, as it does), until the counter says it has them all: msgs/s.
stream(Counter) ->
    T0 = now_ns(),
    Counter ! {count, self(), ?STREAM_N},
    send_n(Counter, ?STREAM_N),
    receive {counted, ?STREAM_N} -> ok end,
    ?STREAM_N / ((now_ns() - T0) / 1.0e9).

send_n(_, 0) -> ok;
send_n(C, N) -> C ! <<N:64, 0:64>>, send_n(C, N - 1).

%% The Erlang/OTP peer of bench_runtime.c: the same six workloads, printed as "name value".
%% Run by run.sh as: erl +S 2 +P 4000000 -noshell -pa DIR -s krt_peer main
-module(krt_peer).
-export([main/0]).

main() ->
    R = [{spawn_skynet_1m, best(3, fun skynet/0, min)},
         {pingpong_1m, best(3, fun pingpong/0, max)},
         {counting_1m, best(3, fun counting/0, max)},
         {ring_100x100k, best(3, fun ring/0, max)},
         {timers_1m_arm_cancel, best(3, fun timers/0, min)},
         {idle_actor_bytes, idle()}],
    [io:format("~s ~.1f~n", [N, float(V)]) || {N, V} <- R],
    halt(0).

best(N, F, Dir) ->
    L = [F() || _ <- lists:seq(1, N)],
    case Dir of min -> lists:min(L); max -> lists:max(L) end.

now_ns() -> erlang:monotonic_time(nanosecond).

%% 10-way tree of 1,000,000 leaves; every node a fresh process reporting its subtree's sum.
skynet() ->
    Self = self(),
    T0 = now_ns(),
    spawn(fun() -> sky(0, 1000000, Self) end),
    receive Sum -> 499999500000 = Sum end,
    (now_ns() - T0) / 1111111.

sky(Num, 1, Parent) -> Parent ! Num;
sky(Num, Size, Parent) ->
    Sub = Size div 10,
    Self = self(),
    [spawn(fun() -> sky(Num + I * Sub, Sub, Self) end) || I <- lists:seq(0, 9)],
    Parent ! collect(10, 0).

collect(0, Acc) -> Acc;
collect(N, Acc) -> receive V -> collect(N - 1, Acc + V) end.

%% 1,000,000 ping/pong round trips.
pong() -> receive {ping, From} -> From ! pong, pong(); stop -> ok end.
ping_loop(_, 0) -> ok;
ping_loop(Pong, N) -> Pong ! {ping, self()}, receive pong -> ping_loop(Pong, N - 1) end.
pingpong() ->
    Self = self(),
    Pong = spawn(fun pong/0),
    Ping = spawn(fun() -> receive go -> ok end, ping_loop(Pong, 1000000), Self ! done end),
    T0 = now_ns(),
    Ping ! go,
    receive done -> ok end,
    T = now_ns() - T0,
    Pong ! stop,
    2000000 / (T / 1.0e9).

%% 1,000,000 increments to a counter process, then a get.
counter(N) -> receive inc -> counter(N + 1); {get, From} -> From ! {count, N} end.
send_n(_, 0) -> ok;
send_n(C, N) -> C ! inc, send_n(C, N - 1).
counting() ->
    Self = self(),
    C = spawn(fun() -> counter(0) end),
    D = spawn(fun() ->
                  receive go -> ok end,
                  send_n(C, 1000000),
                  C ! {get, self()},
                  receive {count, N} -> Self ! {done, N} end
              end),
    T0 = now_ns(),
    D ! go,
    receive {done, 1000000} -> ok end,
    1000000 / ((now_ns() - T0) / 1.0e9).

%% A token passed 100,000 hops around a ring of 100 processes.
ring_node(Self) -> receive {next, Next} -> ring_loop(Next, Self) end.
ring_loop(Next, Self) ->
    receive
        {token, 1} -> Self ! done, ring_loop(Next, Self);
        {token, K} -> Next ! {token, K - 1}, ring_loop(Next, Self);
        stop -> ok
    end.
ring() ->
    Self = self(),
    Ps = [spawn(fun() -> ring_node(Self) end) || _ <- lists:seq(1, 100)],
    [P ! {next, N} || {P, N} <- lists:zip(Ps, tl(Ps) ++ [hd(Ps)])],
    T0 = now_ns(),
    hd(Ps) ! {token, 100000},
    receive done -> ok end,
    T = now_ns() - T0,
    [P ! stop || P <- Ps],
    100000 / (T / 1.0e9).

%% Arm 1,000,000 one-hour timers, then cancel them: ns per operation.
timers() ->
    Self = self(),
    spawn(fun() ->
              T0 = now_ns(),
              Refs = [erlang:start_timer(3600000, self(), x) || _ <- lists:seq(1, 1000000)],
              [erlang:cancel_timer(R) || R <- Refs],
              Self ! {t, now_ns() - T0}
          end),
    receive {t, T} -> T / 2000000 end.

%% Memory per idle process: 100,000 processes waiting in receive.
idle() ->
    erlang:garbage_collect(),
    M0 = erlang:memory(processes),
    Ps = [spawn(fun() -> receive stop -> ok end end) || _ <- lists:seq(1, 100000)],
    M1 = erlang:memory(processes),
    [P ! stop || P <- Ps],
    (M1 - M0) / 100000.

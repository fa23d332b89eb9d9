# Included from tests/CMakeLists.txt (after braid_test is defined).
#
# unit: the network transport's parts on loopback (wire split, ring order, socket plug-in and proxy
# against misbehaving peers).
#
# multihost: ranks on several "hosts", network namespaces joined by veth links and a bridge, made
# by netns_hosts.sh for each test and removed after it; skipped, saying why, where namespaces cannot
# be made (not root). The grid is the multirank grid (tests/multirank/test_grid.cc) built again
# with a seam that moves each forked rank into its host's namespace as it joins (netns_ranks.cc,
# linked with --wrap); rank r runs on host r % hosts. Only the processes_* cases apply: threads
# of one process share a host.
set(BRAID_MULTIHOST_DIR ${CMAKE_CURRENT_LIST_DIR})
set(BRAID_MULTIRANK_DIR ${CMAKE_CURRENT_LIST_DIR}/../multirank)

braid_test(test_net INTERNAL SOURCES ${BRAID_MULTIHOST_DIR}/test_net.cc LABELS net)
if(BRAID_HAVE_UCX)
  target_compile_definitions(test_net PRIVATE BRAID_HAVE_UCX=1)
endif()

# NCCL net plug-ins through braid's loader: braid's socket plug-in (libnccl-net-braid.so) on
# loopback, and the load errors, with libbraid.so as a library without the plug-in symbol and a
# fake plug-in that cannot serve.
add_library(fake_nccl_net MODULE ${BRAID_MULTIHOST_DIR}/fake_nccl_net.cc)
target_include_directories(fake_nccl_net PRIVATE ${PROJECT_SOURCE_DIR})
braid_test(test_nccl_plugin INTERNAL SOURCES ${BRAID_MULTIHOST_DIR}/test_nccl_plugin.cc
  LABELS net)
target_compile_definitions(test_nccl_plugin PRIVATE
  BRAID_PLUGIN_PATH="$<TARGET_FILE:nccl_net_braid>"
  FAKE_PLUGIN_PATH="$<TARGET_FILE:fake_nccl_net>"
  NOT_A_PLUGIN_PATH="$<TARGET_FILE:braid>")
# BRAID_NET_PLUGIN=braid finds libnccl-net-braid.so on the run path of the code that loads it,
# as the installed libbraid finds the plug-in installed beside it.
set_property(TARGET test_nccl_plugin APPEND PROPERTY BUILD_RPATH
  $<TARGET_FILE_DIR:nccl_net_braid>)
add_dependencies(test_nccl_plugin nccl_net_braid fake_nccl_net braid)

function(braid_multihost_binary name)
  add_executable(${name} ${ARGN} ${BRAID_MULTIHOST_DIR}/netns_ranks.cc
    ${BRAID_MULTIRANK_DIR}/rank_launcher.cc)
  target_link_libraries(${name} PRIVATE braid GTest::gtest GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${BRAID_MULTIHOST_DIR}/..)
  target_link_options(${name} PRIVATE -Wl,--wrap=braidCommInitRankConfig)
endfunction()
braid_multihost_binary(test_multihost_grid ${BRAID_MULTIRANK_DIR}/test_grid.cc)
target_compile_options(test_multihost_grid PRIVATE -O2)
braid_multihost_binary(test_multihost_faults ${BRAID_MULTIHOST_DIR}/test_faults.cc)
# Mismatched calls with one rank per host, on the algorithms that receive from partners: no peer
# publishes its call where another reads it, so a rank learns of another call from the first
# slot of it waiting in a FIFO (braidComm::failIfPeersCallDiffers).
braid_multihost_binary(test_multihost_mismatch ${BRAID_MULTIRANK_DIR}/test_mismatch.cc)
target_compile_definitions(test_multihost_mismatch PRIVATE BRAID_MISMATCH_ACROSS_HOSTS=1)

# braid_multihost_test(NAME HOSTS n [IPV6] COMMAND ...)
function(braid_multihost_test name)
  cmake_parse_arguments(T "IPV6" "HOSTS" "COMMAND" ${ARGN})
  set(flags --hosts ${T_HOSTS})
  if(T_IPV6)
    list(APPEND flags --ipv6)
  endif()
  add_test(NAME ${name} COMMAND ${BRAID_MULTIHOST_DIR}/netns_hosts.sh ${flags} -- ${T_COMMAND})
  set_tests_properties(${name} PROPERTIES LABELS multihost SKIP_RETURN_CODE 77 TIMEOUT 300)
endfunction()

set(grid $<TARGET_FILE:test_multihost_grid>)
set(case Grid/Collectives.MatchReference/processes_)
# One rank per host: every hop is a network hop.
braid_multihost_test(multihost_grid_2hosts HOSTS 2 COMMAND ${grid} --gtest_filter=${case}2ranks_*)
# The same over braid's socket transport built as an NCCL net plug-in and loaded as one.
braid_multihost_test(multihost_grid_2hosts_nccl_plugin HOSTS 2
  COMMAND env BRAID_NET_PLUGIN=$<TARGET_FILE:nccl_net_braid> ${grid} --gtest_filter=${case}2ranks_*)
add_dependencies(test_multihost_grid nccl_net_braid)
# 2, 1 and 1 ranks per host: shared memory inside host 0, the network between hosts, and a ring
# the library must reorder (0 3 1 2); messages striped over 3 sockets per connection.
braid_multihost_test(multihost_grid_3hosts HOSTS 3
  COMMAND env BRAID_NSOCKS=3 ${grid} --gtest_filter=${case}4ranks_*)
# Ring calls on 2 CPU channels across hosts: a further set of sockets and proxies per channel.
braid_multihost_test(multihost_grid_3hosts_host_channels HOSTS 3
  COMMAND env BRAID_HOST_NCHANNELS=2 BRAID_HOST_CHANNEL_MIN_BYTES=1 BRAID_ALGO=ring ${grid}
  --gtest_filter=${case}4ranks_*)
# The one-shot all-reduce at every size it can take (BRAID_ALGO=direct): its pieces across hosts
# with 4 ranks, a rank's own input kept aside in place, shared memory inside host 0.
braid_multihost_test(multihost_grid_3hosts_direct HOSTS 3
  COMMAND env BRAID_ALGO=direct ${grid} --gtest_filter=${case}4ranks_allreduce)
# Recursive doubling and halving, the double binary tree, and the hierarchical forms across hosts,
# forced: partners (tree neighbours) on one host and on others; hierarchical, host 0's second
# rank hands over to its leader, and the 3 leaders fold one in (ring 0 3 1 2: leaders 0, 1, 2).
# The trees also run the broadcasts and reduces, rooted at each root the grid names; Bruck's
# algorithm the all-gathers and reduce-scatters, its steps crossing hosts at every distance.
foreach(algo doubling halving tree hier-doubling hier-halving bruck)
  set(filter ${case}4ranks_allreduce)
  if(algo STREQUAL tree)
    set(filter ${filter}:${case}4ranks_broadcast:${case}4ranks_reduce)
  elseif(algo STREQUAL bruck)
    set(filter ${case}4ranks_allgather:${case}4ranks_reducescatter)
  endif()
  braid_multihost_test(multihost_grid_3hosts_${algo} HOSTS 3
    COMMAND env BRAID_ALGO=${algo} ${grid} --gtest_filter=${filter})
endforeach()
# Every mismatch case of 3 ranks on 3 hosts (one each) under those that receive from partners.
foreach(algo doubling tree)
  braid_multihost_test(multihost_mismatch_3hosts_${algo} HOSTS 3
    COMMAND env BRAID_ALGO=${algo} $<TARGET_FILE:test_multihost_mismatch>
    --gtest_filter=*processes_3ranks*)
endforeach()
# Hierarchical with 3, 3 and 2 ranks per host: two followers per leader, 3 leaders.
braid_multihost_test(multihost_grid_3hosts_8ranks_hier HOSTS 3
  COMMAND env BRAID_ALGO=hier ${grid} --gtest_filter=${case}8ranks_allreduce)
# Bruck's all-gather and reduce-scatter with 3, 3 and 2 ranks per host: steps at distance 1 inside
# a host and across, at 2 and 4 across.
braid_multihost_test(multihost_grid_3hosts_8ranks_bruck HOSTS 3
  COMMAND env BRAID_ALGO=bruck ${grid}
  --gtest_filter=${case}8ranks_allgather:${case}8ranks_reducescatter)
# The trees of hosts with 3, 3 and 2 ranks per host (base/binary_trees.h, TreesOfHosts): chains of
# three and two, a host's second rank meeting its second child host; broadcasts and reduces with
# the root's chain starting at the root.
braid_multihost_test(multihost_grid_3hosts_8ranks_tree HOSTS 3
  COMMAND env BRAID_ALGO=tree ${grid}
  --gtest_filter=${case}8ranks_allreduce:${case}8ranks_broadcast:${case}8ranks_reduce)
# Halving with 3, 3 and 2 ranks per host whose first exchange alone halves: the two doubling
# exchanges on the half held cross hosts, their sends through slots, the halving's from its place.
braid_multihost_test(multihost_grid_3hosts_8ranks_halving_1level HOSTS 3
  COMMAND env BRAID_ALGO=halving BRAID_HALVING_LEVELS=1 ${grid}
  --gtest_filter=${case}8ranks_allreduce)
# IPv6 only (no IPv4 address on the links); 2 and 1 ranks per host.
braid_multihost_test(multihost_grid_ipv6 HOSTS 2 IPV6
  COMMAND ${grid} --gtest_filter=${case}3ranks_allreduce:${case}3ranks_sendrecv)

set(faults $<TARGET_FILE:test_multihost_faults>)
braid_multihost_test(multihost_link_down HOSTS 3
  COMMAND ${faults} --gtest_filter=Faults.LinkDownMidAllReduceEveryRankNamesAPeerItLost)
braid_multihost_test(multihost_killed_rank HOSTS 2
  COMMAND ${faults} --gtest_filter=Faults.KilledRankIsNamedByPeersOnEveryHost)
braid_multihost_test(multihost_stops_reading HOSTS 2
  COMMAND ${faults} --gtest_filter=Faults.PeerThatStopsReadingEndsInATimeoutNamingIt)
braid_multihost_test(multihost_failure_reason HOSTS 2
  COMMAND ${faults} --gtest_filter=Faults.FailedRanksReasonReachesPeersOnOtherHosts)
braid_multihost_test(multihost_departure HOSTS 3
  COMMAND ${faults} --gtest_filter=Departure.SendThenDestroyDeliversEverythingAndIsNoFailure)
braid_multihost_test(multihost_refused_at_once HOSTS 2
  COMMAND ${faults} --gtest_filter=Faults.APeerGoneBeforeItsFirstConnectionIsRefusedAtOnce)
# Three sockets per connection: a reason may be read on one before the last parts on another.
braid_multihost_test(multihost_abort_after_success HOSTS 3
  COMMAND env BRAID_NSOCKS=3 ${faults}
  --gtest_filter=Departure.AnAbortRightAfterASuccessfulCallLeavesThePeersCallWhole)
# The same over braid's NCCL net plug-in, which ends its stream when NCCL's closeSend() closes it.
braid_multihost_test(multihost_departure_nccl_plugin HOSTS 3
  COMMAND env BRAID_NET_PLUGIN=$<TARGET_FILE:nccl_net_braid> ${faults}
  --gtest_filter=Departure.SendThenDestroyDeliversEverythingAndIsNoFailure)
add_dependencies(test_multihost_faults nccl_net_braid)

if(BRAID_HAVE_UCX)
# The grid and the failures again over UCX (BRAID_NET=ucx), TCP underneath as on a cluster without
# RDMA: namespaces share the machine, so UCX would otherwise choose shared memory between them.
set(ucx env BRAID_NET=ucx UCX_TLS=tcp)
braid_multihost_test(multihost_grid_2hosts_ucx HOSTS 2
  COMMAND ${ucx} ${grid} --gtest_filter=${case}2ranks_*)
braid_multihost_test(multihost_grid_3hosts_ucx HOSTS 3
  COMMAND ${ucx} ${grid} --gtest_filter=${case}4ranks_*)
braid_multihost_test(multihost_grid_ipv6_ucx HOSTS 2 IPV6
  COMMAND ${ucx} ${grid} --gtest_filter=${case}3ranks_allreduce:${case}3ranks_sendrecv)
braid_multihost_test(multihost_link_down_ucx HOSTS 3
  COMMAND ${ucx} ${faults} --gtest_filter=Faults.LinkDownMidAllReduceEveryRankNamesAPeerItLost)
braid_multihost_test(multihost_killed_rank_ucx HOSTS 2
  COMMAND ${ucx} ${faults} --gtest_filter=Faults.KilledRankIsNamedByPeersOnEveryHost)
braid_multihost_test(multihost_stops_reading_ucx HOSTS 2
  COMMAND ${ucx} ${faults} --gtest_filter=Faults.PeerThatStopsReadingEndsInATimeoutNamingIt)
braid_multihost_test(multihost_failure_reason_ucx HOSTS 2
  COMMAND ${ucx} ${faults} --gtest_filter=Faults.FailedRanksReasonReachesPeersOnOtherHosts)
braid_multihost_test(multihost_departure_ucx HOSTS 3
  COMMAND ${ucx} ${faults} --gtest_filter=Departure.SendThenDestroyDeliversEverythingAndIsNoFailure)
endif()

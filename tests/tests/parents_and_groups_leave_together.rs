//! Parents and groups: a block whose parent leaves the node (removed, evicted from its last tier) leaves
//! too, and so on down the chain, on whichever shard each block lives; a group leaves as a whole, or — when
//! one of its members is pinned — not at all. Hard-pinned blocks stay. Links never cross tenants.

mod common;

use std::time::{Duration, Instant};

use common::{Scratch, client, config, key_of, start, total, value_of, with_file};
use strata_client::{BlockPut, Client, ClientOptions, Event, Links, Pin, PutOptions, RemovalReason};
use strata_proto::shard_of;

/// Waits up to 10 s for `done`; returns whether it came true.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

/// The first key `prefix/N` that lands on `shard` of a two-shard node.
fn key_on_shard(prefix: &str, shard: u32) -> Vec<u8> {
    (0..1000u64)
        .map(|index| format!("{prefix}/{index}").into_bytes())
        .find(|key| shard_of(key, 2) == shard)
        .expect("a key on the shard")
}

fn present(client: &mut Client, keys: &[Vec<u8>]) -> Vec<bool> {
    let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    client.batch_exists(&keys).into_iter().map(|result| result.expect("exists")).collect()
}

/// Puts a chain of `len` blocks of `size` bytes, each naming the one before it; returns the keys.
fn put_chain(client: &mut Client, first: u64, len: u64, size: usize) -> Vec<Vec<u8>> {
    let keys: Vec<Vec<u8>> = (first..first + len).map(key_of).collect();
    let values: Vec<Vec<u8>> = (first..first + len).map(|index| value_of(index, size)).collect();
    let parts: Vec<[&[u8]; 1]> = values.iter().map(|value| [value.as_slice()]).collect();
    let blocks: Vec<BlockPut<'_>> = (0..keys.len())
        .map(|at| BlockPut {
            key: &keys[at],
            parts: &parts[at],
            links: if at == 0 { Links::NONE } else { Links::parent(&keys[at - 1]) },
        })
        .collect();
    for result in client.batch_put_blocks(&blocks, PutOptions::default()) {
        result.expect("put");
    }
    keys
}

#[test]
fn removing_a_block_removes_its_descendants_on_every_shard() {
    let node = start(config(&[0, 1], 32 << 20));
    let mut client = client(&node);
    let events = client.subscribe_events(None).expect("subscribe");
    let chain = put_chain(&mut client, 0, 20, 4096);
    let shards: std::collections::HashSet<u32> = chain.iter().map(|key| shard_of(key, 2)).collect();
    assert_eq!(shards.len(), 2, "the chain spans both shards");
    // A second branch from block 4, and a block that names nothing.
    client.put_linked(b"branch", &value_of(99, 100), Links::parent(&chain[4]), PutOptions::default()).expect("put");
    client.put(b"unrelated", &value_of(98, 100)).expect("put");

    client.remove(&chain[10]).expect("remove");
    assert!(eventually(|| present(&mut client, &chain[10..]).iter().all(|&here| !here)), "the suffix left");
    assert!(present(&mut client, &chain[..10]).iter().all(|&here| here), "the prefix stays");
    assert!(client.exists(b"branch").expect("exists") && client.exists(b"unrelated").expect("exists"));
    assert_eq!(total(&node, |shard| &shard.cascade_removals), 9);

    // Removing the branch point takes both branches.
    client.remove(&chain[3]).expect("remove");
    assert!(eventually(|| !client.exists(b"branch").expect("exists")), "the side branch left");
    assert!(eventually(|| present(&mut client, &chain[4..10]).iter().all(|&here| !here)));
    assert!(present(&mut client, &chain[..3]).iter().all(|&here| here));
    assert!(client.exists(b"unrelated").expect("exists"));

    // A router saw each block stored with its parent, and why each one left.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Seventeen blocks removed, in however many events.
    while seen.iter().filter(|event| matches!(event, Event::BlockRemoved { .. })).map(Event::blocks).sum::<usize>() < 17
        && Instant::now() < deadline
    {
        if let Some(event) = events.next_timeout(Duration::from_millis(50)) {
            seen.push(event.expect("event").event);
        }
    }
    let stored_with = |key: &[u8]| {
        seen.iter()
            .flat_map(Event::stored_blocks)
            .find_map(|(stored, parent)| (stored == key).then(|| parent.map(<[u8]>::to_vec)))
    };
    assert_eq!(stored_with(&chain[5]), Some(Some(chain[4].clone())));
    assert_eq!(stored_with(&chain[0]), Some(None));
    let reason_of = |key: &[u8]| {
        seen.iter().find_map(|event| match event {
            Event::BlockRemoved { keys, reason } if keys.iter().any(|removed| removed == key) => Some(*reason),
            _ => None,
        })
    };
    assert_eq!(reason_of(&chain[10]), Some(RemovalReason::Removed));
    assert_eq!(reason_of(&chain[19]), Some(RemovalReason::Cascaded));
    assert_eq!(reason_of(b"branch"), Some(RemovalReason::Cascaded));
    assert_eq!(reason_of(&chain[2]), None);
}

#[test]
fn an_evicted_parent_takes_its_children_however_hot_they_are() {
    // DRAM only, so an eviction is a departure. Children are read constantly (referenced, leased); their
    // parent is not, and is the one the clock takes.
    let mut node_config = config(&[0, 1], 8 << 20);
    node_config.read_lease = Duration::from_secs(60);
    let node = start(node_config);
    let mut client = client(&node);
    let chain = put_chain(&mut client, 0, 8, 64 << 10);
    let mut filler = 1000u64;
    let deadline = Instant::now() + Duration::from_secs(20);
    while client.exists(&chain[0]).expect("exists") && Instant::now() < deadline {
        for key in &chain[1..] {
            let _ = client.get(key);
        }
        client.put(&key_of(filler), &value_of(filler, 64 << 10)).expect("put");
        filler += 1;
    }
    assert!(!client.exists(&chain[0]).expect("exists"), "the cold parent was evicted");
    assert!(eventually(|| present(&mut client, &chain[1..]).iter().all(|&here| !here)), "its children left");
    assert!(total(&node, |shard| &shard.cascade_removals) >= 7);
    // The newest filler, which names nothing, is untouched.
    assert!(client.exists(&key_of(filler - 1)).expect("exists"));
}

#[test]
fn a_group_leaves_as_a_whole_and_a_pinned_member_keeps_it() {
    let node = start(config(&[0, 1], 8 << 20));
    let mut client = client(&node);
    // All layers of one block: four members spread over both shards.
    let members: Vec<Vec<u8>> = (0..4).map(|layer| format!("block-7/layer-{layer}").into_bytes()).collect();
    assert_eq!(members.iter().map(|key| shard_of(key, 2)).collect::<std::collections::HashSet<_>>().len(), 2);
    for (layer, key) in members.iter().enumerate() {
        client
            .put_linked(key, &value_of(layer as u64, 1000), Links::group(b"block-7"), PutOptions::default())
            .expect("put");
    }
    client.remove(&members[2]).expect("remove");
    assert!(eventually(|| present(&mut client, &members).iter().all(|&here| !here)), "the group left as a whole");

    // Two members on one shard, one of them hard-pinned: DRAM pressure on that shard evicts neither, and
    // the unpinned one goes only when the pinned one is removed.
    let same_shard: Vec<Vec<u8>> = (0..100u64)
        .map(|index| format!("pair/{index}").into_bytes())
        .filter(|key| shard_of(key, 2) == 0)
        .take(2)
        .collect();
    let (loose, pinned) = (&same_shard[0], &same_shard[1]);
    client.put_linked(loose, &value_of(1, 64 << 10), Links::group(b"pair"), PutOptions::default()).expect("put");
    let hard = PutOptions { pin: Pin::Hard, ..PutOptions::default() };
    client.put_linked(pinned, &value_of(2, 64 << 10), Links::group(b"pair"), hard).expect("put");
    for index in 0..400u64 {
        client.put(&key_of(index), &value_of(index, 64 << 10)).expect("put");
    }
    assert!(!client.exists(&key_of(0)).expect("exists"), "16 MiB over 8 MiB of DRAM evicted the oldest");
    assert!(client.exists(loose).expect("exists"), "a pinned member keeps its group");
    client.remove(pinned).expect("remove");
    assert!(eventually(|| !client.exists(loose).expect("exists")), "then the group leaves");
}

#[test]
fn a_hard_pinned_member_keeps_its_group_on_every_shard() {
    let node = start(config(&[0, 1], 8 << 20));
    let mut client = client(&node);
    // The pinned member on shard 0, the loose one on shard 1.
    let (pinned, loose) = (key_on_shard("kv-pinned", 0), key_on_shard("kv-loose", 1));
    client.put_linked(&loose, &value_of(1, 64 << 10), Links::group(b"block-9"), PutOptions::default()).expect("put");
    let hard = PutOptions { pin: Pin::Hard, ..PutOptions::default() };
    client.put_linked(&pinned, &value_of(2, 64 << 10), Links::group(b"block-9"), hard).expect("put");
    // Shard 1 hears of the pin through the mesh: give the message a moment before the pressure starts.
    std::thread::sleep(Duration::from_millis(100));
    let fill_shard_1 = |client: &mut Client, first: u64| {
        let keys: Vec<Vec<u8>> =
            (first..first + 2000).map(key_of).filter(|key| shard_of(key, 2) == 1).take(200).collect();
        for (at, key) in keys.iter().enumerate() {
            client.put(key, &value_of(at as u64, 64 << 10)).expect("put");
        }
        keys
    };
    let filler = fill_shard_1(&mut client, 0);
    assert!(!client.exists(&filler[0]).expect("exists"), "12.5 MiB over shard 1's 4 MiB evicted its oldest");
    assert!(client.exists(&loose).expect("exists"), "shard 1 kept the member whose group is pinned on shard 0");
    assert!(client.exists(&pinned).expect("exists"));

    // The pinned member is removed: the group leaves whole, and shard 1 hears the pin is gone, so a new
    // member of the group there is evicted like anything else.
    client.remove(&pinned).expect("remove");
    assert!(eventually(|| !client.exists(&loose).expect("exists")), "the group left with its pinned member");
    let newcomer = key_on_shard("kv-newcomer", 1);
    client.put_linked(&newcomer, &value_of(3, 64 << 10), Links::group(b"block-9"), PutOptions::default()).expect("put");
    fill_shard_1(&mut client, 10_000);
    assert!(!client.exists(&newcomer).expect("exists"), "no pin left anywhere: the member was evicted");
    node.shutdown().expect("shutdown");
}

#[test]
fn a_restored_hard_pin_keeps_its_group_on_every_shard() {
    let scratch = Scratch::new("pinned-group-restart");
    let path = scratch.file("ns0.img");
    // 4 MiB of DRAM and 12 MiB of NVMe per shard: a shard's departures come from its NVMe reclaim.
    let node_config = || with_file(config(&[0, 1], 8 << 20), &path, 24 << 20);
    let (pinned, loose) = (key_on_shard("kv-pinned", 0), key_on_shard("kv-loose", 1));
    let node = start(node_config());
    let mut client = common::client(&node);
    let durable = PutOptions { policy: Some(strata_client::WritePolicy::Durable), ..PutOptions::default() };
    client.put_linked(&loose, &value_of(1, 64 << 10), Links::group(b"block-3"), durable).expect("put");
    let hard = PutOptions { pin: Pin::Hard, ..durable };
    client.put_linked(&pinned, &value_of(2, 64 << 10), Links::group(b"block-3"), hard).expect("put");
    node.shutdown().expect("shutdown");

    // After the restart, shard 0 tells shard 1 of the pin it restored; 40 MiB through shard 1 (over its
    // 16 MiB of DRAM and NVMe) reclaim every region, and the loose member is carried along each time.
    let node = start(node_config());
    let mut client = common::client(&node);
    std::thread::sleep(Duration::from_millis(100));
    let filler: Vec<Vec<u8>> = (0..5000u64).map(key_of).filter(|key| shard_of(key, 2) == 1).take(640).collect();
    for (at, key) in filler.iter().enumerate() {
        client.put(key, &value_of(at as u64, 64 << 10)).expect("put");
    }
    assert!(!client.exists(&filler[0]).expect("exists"), "shard 1's oldest blocks left the node");
    assert_eq!(client.get(&loose).expect("the member of a pinned group stayed"), value_of(1, 64 << 10));
    assert_eq!(client.get(&pinned).expect("the pinned member"), value_of(2, 64 << 10));
    node.shutdown().expect("shutdown");
}

#[test]
fn links_survive_a_restart_and_cascade_after_it() {
    let scratch = Scratch::new("links-restart");
    let path = scratch.file("ns0.img");
    let node_config = || with_file(config(&[0, 1], 32 << 20), &path, 128 << 20);
    let node = start(node_config());
    let mut client = common::client(&node);
    let durable = PutOptions { policy: Some(strata_client::WritePolicy::Durable), ..PutOptions::default() };
    let keys: Vec<Vec<u8>> = (0..12).map(key_of).collect();
    for (index, key) in keys.iter().enumerate() {
        let links = if index == 0 { Links::NONE } else { Links::parent(&keys[index - 1]) };
        client.put_linked(key, &value_of(index as u64, 3000), links, durable).expect("put");
    }
    let members = [b"pair/k".to_vec(), b"pair/v".to_vec()];
    for member in &members {
        client.put_linked(member, b"half", Links::group(b"pair"), durable).expect("put");
    }
    // A block upserted without links before the restart stays unlinked after it.
    client.put_with(&keys[11], &value_of(11, 3000), PutOptions { upsert: true, ..durable }).expect("upsert");
    node.shutdown().expect("shutdown");

    let node = start(node_config());
    let mut client = common::client(&node);
    assert!(present(&mut client, &keys).iter().all(|&here| here), "every durable block is back");
    assert_eq!(client.get(&keys[7]).expect("get"), value_of(7, 3000), "values after the links are intact");
    client.remove(&keys[8]).expect("remove");
    assert!(eventually(|| present(&mut client, &keys[8..11]).iter().all(|&here| !here)), "8's suffix left");
    std::thread::sleep(Duration::from_millis(200));
    assert!(present(&mut client, &keys[..8]).iter().all(|&here| here));
    assert!(client.exists(&keys[11]).expect("exists"), "the upserted block no longer hangs from 10");
    client.remove(&members[1]).expect("remove");
    assert!(eventually(|| !client.exists(&members[0]).expect("exists")), "the group left together");
    node.shutdown().expect("shutdown");

    // And the cascade's tombstones hold across another restart.
    let node = start(node_config());
    let mut client = common::client(&node);
    assert_eq!(present(&mut client, &keys), [[true; 8].as_slice(), &[false; 3], &[true]].concat());
    assert!(!client.exists(&members[0]).expect("exists"));
    node.shutdown().expect("shutdown");
}

#[test]
fn hard_pins_stay_upserts_relink_and_tenants_never_link_across() {
    let mut node_config = config(&[0, 1], 32 << 20);
    let tenant = |name: &str| strata_engine::tenants::TenantConfig {
        name: name.into(),
        token: format!("token-of-{name}").into_bytes(),
        dram_quota: None,
        nvme_quota: None,
        max_pinned: None,
    };
    node_config.tenants = vec![tenant("alpha"), tenant("beta")];
    let node = start(node_config);
    let connect = |name: &str| {
        let options =
            ClientOptions { token: Some(format!("token-of-{name}").into_bytes()), ..ClientOptions::default() };
        Client::connect(node.local_addr(), options).expect("connect")
    };
    let (mut alpha, mut beta) = (connect("alpha"), connect("beta"));

    // A hard-pinned child stays when its parent goes; so does what hangs below it.
    alpha.put(b"root", b"r").expect("put");
    let hard = PutOptions { pin: Pin::Hard, ..PutOptions::default() };
    alpha.put_linked(b"pinned", b"p", Links::parent(b"root"), hard).expect("put");
    alpha.put_linked(b"below", b"b", Links::parent(b"pinned"), PutOptions::default()).expect("put");
    // An upsert names what it names: this child no longer hangs from the root.
    alpha.put_linked(b"moved", b"m", Links::parent(b"root"), PutOptions::default()).expect("put");
    alpha.put_with(b"moved", b"m2", PutOptions::upsert()).expect("upsert");
    alpha.put_linked(b"child", b"c", Links::parent(b"root"), PutOptions::default()).expect("put");
    // Beta's block names a parent called "root" too: beta's own, which beta never stored.
    beta.put_linked(b"child", b"beta", Links::parent(b"root"), PutOptions::default()).expect("put");

    alpha.remove(b"root").expect("remove");
    assert!(eventually(|| !alpha.exists(b"child").expect("exists")), "alpha's child left with its parent");
    // Give any stray cascade time to arrive before checking what must not have left.
    std::thread::sleep(Duration::from_millis(200));
    assert!(alpha.exists(b"pinned").expect("exists") && alpha.exists(b"below").expect("exists"));
    assert_eq!(alpha.get(b"moved").expect("get"), b"m2");
    assert_eq!(beta.get(b"child").expect("get"), b"beta", "another tenant's link is its own");

    // Names over the key bound are refused per item, before anything is sent.
    let long = vec![b'p'; 2000];
    assert!(matches!(
        alpha.put_linked(b"k", b"v", Links::parent(&long), PutOptions::default()),
        Err(strata_client::ClientError::TooLarge(_))
    ));
}

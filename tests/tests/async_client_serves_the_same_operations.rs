//! The async front serves the blocking client's operations from async code, with owned buffers and a
//! result per key, and two async clients progress concurrently on one single-threaded executor.

mod common;

use common::{config, key_of, start, value_of};
use std::time::Duration;

use strata_client::{AsyncClient, ClientError, ClientOptions, Event, OwnedBlock, PutOptions, RemovalReason};

#[test]
fn async_calls_round_trip_and_run_concurrently() {
    let node = start(config(&[0, 1], 32 << 20));
    let addr = node.local_addr();
    futures_lite::future::block_on(async move {
        let first = AsyncClient::connect(addr, ClientOptions::default()).await.expect("connect");
        let second = AsyncClient::connect(addr, ClientOptions::default()).await.expect("connect");
        first.put(key_of(1), value_of(1, 5000), PutOptions::default()).await.expect("put");
        assert_eq!(first.get(key_of(1)).await.expect("get"), value_of(1, 5000));
        let (buffer, length) = first.get_into(key_of(1), vec![0u8; 8192]).await;
        assert_eq!(length, Ok(5000));
        assert_eq!(&buffer[..5000], &value_of(1, 5000)[..]);
        // A put does not replace a stored key; an upsert does.
        assert_eq!(first.put(key_of(1), value_of(2, 10), PutOptions::default()).await, Err(ClientError::Exists));
        assert_eq!(first.get(key_of(1)).await.expect("get").len(), 5000);
        first.put(key_of(1), value_of(1, 5000), PutOptions::upsert()).await.expect("upsert");
        let chain = vec![key_of(1), key_of(404), key_of(1)];
        assert_eq!(second.prefix_match(chain).await, Ok(1));
        let (_, too_small) = first.get_into(key_of(1), vec![0u8; 10]).await;
        assert!(matches!(too_small, Err(ClientError::BufferTooSmall { needed: 5000, .. })));

        // Two clients' batches in flight at once from one thread.
        let items = |base: u64| (base..base + 32).map(|i| (key_of(i), value_of(i, 1024))).collect::<Vec<_>>();
        let (a, b) = futures_lite::future::zip(
            first.batch_put(items(100), PutOptions::default()),
            second.batch_put(items(200), PutOptions::default()),
        )
        .await;
        assert!(a.iter().chain(&b).all(Result::is_ok));
        let keys: Vec<Vec<u8>> = vec![key_of(100), key_of(999), key_of(231)];
        let (buffers, lengths) = second.batch_get_into(keys.clone(), vec![vec![0u8; 1024]; 3]).await;
        assert_eq!(lengths, vec![Ok(1024), Err(ClientError::NotFound), Ok(1024)]);
        assert_eq!(buffers[0], value_of(100, 1024));
        assert_eq!(buffers[2], value_of(231, 1024));
        assert_eq!(first.batch_exists(keys.clone()).await, vec![Ok(true), Ok(false), Ok(true)]);
        let got = first.batch_get(keys.clone()).await;
        assert_eq!(got[1], Err(ClientError::NotFound));
        assert_eq!(second.batch_remove(keys.clone()).await, vec![Ok(()), Err(ClientError::NotFound), Ok(())]);
        assert!(!first.exists(key_of(100)).await.expect("exists"));
        assert_eq!(first.remove(key_of(100)).await, Err(ClientError::NotFound));

        // The serving-engine extras: layers by range, linked blocks, events, removal by pattern.
        let (layer, read) = first.get_range_into(key_of(1), 1000, vec![0u8; 500]).await;
        assert_eq!(read, Ok(500));
        assert_eq!(&layer[..], &value_of(1, 5000)[1000..1500]);
        let events = second.subscribe_events(Some(b"chain/".to_vec())).await.expect("subscribe");
        let blocks: Vec<OwnedBlock> = (0..4u8)
            .map(|index| OwnedBlock {
                key: format!("chain/{index}").into_bytes(),
                value: vec![index; 100],
                parent: index.checked_sub(1).map(|parent| format!("chain/{parent}").into_bytes()),
                group: None,
            })
            .collect();
        assert!(first.batch_put_blocks(blocks, PutOptions::default()).await.iter().all(Result::is_ok));
        first
            .put_linked(b"chain/x".to_vec(), vec![9; 10], Some(b"chain/3".to_vec()), None, PutOptions::default())
            .await
            .expect("put");
        first.remove(b"chain/1".to_vec()).await.expect("remove");
        let mut cascaded = 0;
        for _ in 0..200 {
            match events.next_timeout(Duration::from_millis(50)) {
                Some(event) => {
                    // Counted in blocks: one event may name several keys.
                    if let Event::BlockRemoved { keys, reason: RemovalReason::Cascaded } = event.expect("event").event {
                        cascaded += keys.len();
                    }
                }
                None if cascaded == 3 => break,
                None => {}
            }
        }
        assert_eq!(cascaded, 3, "chain/2, chain/3 and chain/x left with chain/1");
        assert_eq!(first.remove_matching("^chain/".into()).await, Ok(1), "only chain/0 was left");
    });
    // A node that is not there: the connect error comes back through the future.
    let refused = futures_lite::future::block_on(AsyncClient::connect(
        "127.0.0.1:1".parse().expect("addr"),
        ClientOptions::default(),
    ));
    assert!(matches!(refused, Err(ClientError::Connection(_))));
    node.shutdown().expect("shutdown");
}

#[test]
fn async_layers_gathers_and_progressive_puts_match_the_blocking_client() {
    let node = start(config(&[0, 1], 32 << 20));
    let addr = node.local_addr();
    futures_lite::future::block_on(async move {
        let writer = AsyncClient::connect(addr, ClientOptions::default()).await.expect("connect");
        let reader = AsyncClient::connect(addr, ClientOptions::default()).await.expect("connect");

        // One key from four layer buffers, read back into four buffers; the buffers come back.
        let layers: Vec<Vec<u8>> = (0..4).map(|layer| value_of(10 + layer, 700)).collect();
        let (sent, stored) = writer.put_parts(key_of(1), layers.clone(), PutOptions::default()).await;
        assert_eq!((sent.len(), stored), (4, Ok(())));
        assert_eq!(reader.get_size(key_of(1)).await, Ok(2800));
        let (read, length) = reader.get_into_parts(key_of(1), vec![vec![0u8; 700]; 4]).await;
        assert_eq!((read, length), (layers.clone(), Ok(2800)));
        assert_eq!(reader.get_size(key_of(404)).await, Err(ClientError::NotFound));

        // Scatter one buffer over three keys, gather slices of them (and of a missing key) into another.
        let source = value_of(7, 3000);
        let pieces = vec![(key_of(20), 1000), (key_of(21), 1500), (key_of(22), 500)];
        let (source, results) = writer.scatter_put(source, pieces, PutOptions::default()).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        let ranges = vec![(key_of(22), 100, 200), (key_of(404), 0, 8), (key_of(20), 0, 300)];
        let (gathered, results) = reader.gather_into(ranges, vec![0u8; 508]).await;
        assert_eq!(results, vec![Ok(200), Err(ClientError::NotFound), Ok(300)]);
        assert_eq!(&gathered[..200], &source[2600..2800]);
        assert_eq!(&gathered[208..], &source[..300]);

        // Two chains in one call: one stops at its second key, one is whole.
        let chains = vec![vec![key_of(20), key_of(404), key_of(21)], vec![key_of(20), key_of(21), key_of(22)]];
        assert_eq!(reader.batch_prefix_match(chains).await, vec![Ok(1), Ok(3)]);

        // A progressive put: its first layer is readable before the second is sent; a wrong length is refused
        // without losing the put.
        let mut put = writer
            .put_progressive(key_of(30), vec![600, 400], Some(key_of(1)), None, PutOptions::default())
            .await
            .expect("start");
        assert_eq!(put.part_count(), 2);
        let (first, sent) = put.send_part(value_of(30, 600)).await;
        assert_eq!((first.len(), sent), (600, Ok(())));
        // (The put's header may still be on its way on the writer's connection: the reader waits for it.)
        let (layer, read) = reader.get_range_into_waiting(key_of(30), 0, vec![0u8; 600], Duration::from_secs(5)).await;
        assert_eq!((layer, read), (value_of(30, 600), Ok(600)), "the first layer before the second was sent");
        let (_, wrong) = put.send_part(vec![0u8; 10]).await;
        assert!(matches!(wrong, Err(ClientError::Invalid(_))), "{wrong:?}");
        assert_eq!(put.parts_sent(), 1);
        let (_, sent) = put.send_part(value_of(31, 400)).await;
        assert_eq!(sent, Ok(()));
        put.finish().await.expect("finish");
        let whole = reader.get(key_of(30)).await.expect("get");
        assert_eq!(&whole[..600], &value_of(30, 600)[..]);
        assert_eq!(&whole[600..], &value_of(31, 400)[..]);
        // Its parent leaves, so does it.
        writer.remove(key_of(1)).await.expect("remove");
        let mut gone = false;
        for _ in 0..100 {
            if !reader.exists(key_of(30)).await.expect("exists") {
                gone = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(gone, "the progressive put's parent was removed and it stayed");

        // An abandoned put stores nothing: its first layer was readable, and after the drop it is not.
        let mut abandoned =
            writer.put_progressive(key_of(40), vec![100, 100], None, None, PutOptions::default()).await.expect("start");
        let (_, sent) = abandoned.send_part(value_of(40, 100)).await;
        assert_eq!(sent, Ok(()));
        let (_, read) = reader.get_range_into_waiting(key_of(40), 0, vec![0u8; 100], Duration::from_secs(5)).await;
        assert_eq!(read, Ok(100));
        drop(abandoned);
        let mut readable = true;
        for _ in 0..100 {
            if reader.get_range_into(key_of(40), 0, vec![0u8; 100]).await.1 == Err(ClientError::NotFound) {
                readable = false;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!readable, "an abandoned progressive put stayed readable");
        assert_eq!(reader.get_size(key_of(40)).await, Err(ClientError::NotFound));
    });
    node.shutdown().expect("shutdown");
}

//! The async front: [`AsyncClient`] runs the one blocking implementation ([`Client`]) on a thread of its
//! own and hands it work by message, so an async caller (tokio, glommio, any executor: the futures here
//! depend on no runtime) never blocks its executor on a socket.
//!
//! Buffers are owned, as in io_uring-style APIs: `get_into` takes a `Vec<u8>` and gives it back filled,
//! because a borrowed buffer could not outlive a future that is dropped while the I/O thread writes into it.
//! The cost is one thread per `AsyncClient` and one hand-off per call (a few microseconds); calls from many
//! tasks are served in order on the client's connections. For parallelism, open several.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, mpsc};
use std::task::{Context, Poll, Waker};

use strata_proto::{Links, PutOptions};

use crate::client::{BlockPut, Client, ClientOptions, KeyRange, ProgressivePut};
use crate::error::ClientError;

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    closed: bool,
}

/// The receiving half of a one-shot reply: resolves to `None` if the I/O thread went away.
struct Reply<T>(Arc<Mutex<Slot<T>>>);

/// The sending half; dropping it unsent closes the reply.
struct ReplySender<T>(Arc<Mutex<Slot<T>>>);

fn reply_channel<T>() -> (ReplySender<T>, Reply<T>) {
    let slot = Arc::new(Mutex::new(Slot { value: None, waker: None, closed: false }));
    (ReplySender(Arc::clone(&slot)), Reply(slot))
}

impl<T> ReplySender<T> {
    fn send(self, value: T) {
        let waker = {
            let mut slot = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            slot.value = Some(value);
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Drop for ReplySender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut slot = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            slot.closed = true;
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Future for Reply<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<T>> {
        let mut slot = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(value) = slot.value.take() {
            return Poll::Ready(Some(value));
        }
        if slot.closed {
            return Poll::Ready(None);
        }
        slot.waker = Some(context.waker().clone());
        Poll::Pending
    }
}

type Job = Box<dyn FnOnce(&mut Client) + Send>;

/// One put of [`AsyncClient::batch_put_blocks`], owned.
#[derive(Clone, Debug, Default)]
pub struct OwnedBlock {
    /// Its key.
    pub key: Vec<u8>,
    /// Its value.
    pub value: Vec<u8>,
    /// Its parent's key.
    pub parent: Option<Vec<u8>>,
    /// Its group's name.
    pub group: Option<Vec<u8>>,
}

/// An async client of one node (see the module doc).
pub struct AsyncClient {
    jobs: Option<mpsc::Sender<Job>>,
    worker: Option<std::thread::JoinHandle<()>>,
}

fn gone() -> ClientError {
    ClientError::Connection("the client's I/O thread is gone".into())
}

impl AsyncClient {
    /// Connects to the node at `addr` (any shard's port), on the client's own I/O thread.
    pub async fn connect(addr: SocketAddr, options: ClientOptions) -> Result<Self, ClientError> {
        Self::start(move || Client::connect(addr, options)).await
    }

    /// Connects to the cluster `options` names ([`Client::connect_cluster`]), on the client's own I/O
    /// thread.
    pub async fn connect_cluster(options: crate::ClusterOptions) -> Result<Self, ClientError> {
        Self::start(move || Client::connect_cluster(&options)).await
    }

    /// Runs `connect` on a new I/O thread, which then serves this client's calls.
    async fn start(
        connect: impl FnOnce() -> Result<Client, ClientError> + Send + 'static,
    ) -> Result<Self, ClientError> {
        let (jobs, queue) = mpsc::channel::<Job>();
        let (ready, connected) = reply_channel::<Result<(), ClientError>>();
        let worker = std::thread::Builder::new()
            .name("strata-client".into())
            .spawn(move || {
                let mut client = match connect() {
                    Ok(client) => {
                        ready.send(Ok(()));
                        client
                    }
                    Err(error) => return ready.send(Err(error)),
                };
                // Ends when every sender is dropped (the AsyncClient was dropped).
                while let Ok(job) = queue.recv() {
                    job(&mut client);
                }
            })
            .map_err(|error| ClientError::Connection(format!("starting the I/O thread: {error}")))?;
        connected.await.ok_or_else(gone)??;
        Ok(Self { jobs: Some(jobs), worker: Some(worker) })
    }

    async fn call<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Client) -> T + Send + 'static,
    ) -> Result<T, ClientError> {
        let (sender, reply) = reply_channel();
        let job: Job = Box::new(move |client| sender.send(work(client)));
        self.jobs.as_ref().ok_or_else(gone)?.send(job).map_err(|_| gone())?;
        reply.await.ok_or_else(gone)
    }

    /// Runs `work` on the client with `buffers` the caller owns, and gives them back with its result; when
    /// the I/O thread is gone, the buffers cannot be recovered from the dropped job: empty ones come back
    /// with `failed`'s result.
    async fn call_with<B: Default + Send + 'static, T: Send + 'static>(
        &self,
        mut buffers: B,
        work: impl FnOnce(&mut Client, &mut B) -> T + Send + 'static,
        failed: impl FnOnce() -> T,
    ) -> (B, T) {
        let (sender, reply) = reply_channel();
        let job: Job = Box::new(move |client| {
            let result = work(client, &mut buffers);
            sender.send((buffers, result));
        });
        match self.jobs.as_ref().map(|jobs| jobs.send(job)) {
            Some(Ok(())) => match reply.await {
                Some(done) => done,
                None => (B::default(), failed()),
            },
            _ => (B::default(), failed()),
        }
    }

    /// Stores `value` under `key` with `options` (a stored key is refused with `Exists` unless
    /// `options.upsert`).
    pub async fn put(&self, key: Vec<u8>, value: Vec<u8>, options: PutOptions) -> Result<(), ClientError> {
        self.call(move |client| client.put_with(&key, &value, options)).await?
    }

    /// How many leading keys of `chain` are stored.
    pub async fn prefix_match(&self, chain: Vec<Vec<u8>>) -> Result<usize, ClientError> {
        self.call(move |client| client.prefix_match(&chain.iter().map(Vec::as_slice).collect::<Vec<_>>())).await?
    }

    /// Reads `key`'s value.
    pub async fn get(&self, key: Vec<u8>) -> Result<Vec<u8>, ClientError> {
        self.call(move |client| client.get(&key)).await?
    }

    /// Reads `key`'s value into `buffer` (straight from the socket) and gives the buffer back with the
    /// value's length.
    pub async fn get_into(&self, key: Vec<u8>, buffer: Vec<u8>) -> (Vec<u8>, Result<usize, ClientError>) {
        self.call_with(buffer, move |client, buffer| client.get_into(&key, buffer), || Err(gone())).await
    }

    /// Reads `buffer.len()` bytes at `offset` of `key`'s value (one layer, say) into `buffer`; gives the
    /// buffer back with the bytes read.
    pub async fn get_range_into(
        &self,
        key: Vec<u8>,
        offset: u32,
        buffer: Vec<u8>,
    ) -> (Vec<u8>, Result<usize, ClientError>) {
        self.get_range_into_waiting(key, offset, buffer, std::time::Duration::ZERO).await
    }

    /// [`get_range_into`](Self::get_range_into) of a key that may not be stored yet: the node waits up to
    /// `wait` for it (see [`Client::get_range_into_waiting`]).
    pub async fn get_range_into_waiting(
        &self,
        key: Vec<u8>,
        offset: u32,
        buffer: Vec<u8>,
        wait: std::time::Duration,
    ) -> (Vec<u8>, Result<usize, ClientError>) {
        let work =
            move |client: &mut Client, buffer: &mut Vec<u8>| client.get_range_into_waiting(&key, offset, buffer, wait);
        self.call_with(buffer, work, || Err(gone())).await
    }

    /// Stores `value` under `key`, naming its parent and/or group (see [`Client::put_linked`]).
    pub async fn put_linked(
        &self,
        key: Vec<u8>,
        value: Vec<u8>,
        parent: Option<Vec<u8>>,
        group: Option<Vec<u8>>,
        options: PutOptions,
    ) -> Result<(), ClientError> {
        self.call(move |client| {
            let links = Links { parent: parent.as_deref(), group: group.as_deref() };
            client.put_linked(&key, &value, links, options)
        })
        .await?
    }

    /// Stores every `(key, value, parent, group)` (see [`Client::batch_put_blocks`]); a result per key.
    pub async fn batch_put_blocks(&self, blocks: Vec<OwnedBlock>, options: PutOptions) -> Vec<Result<(), ClientError>> {
        let count = blocks.len();
        let result = self
            .call(move |client| {
                let parts: Vec<[&[u8]; 1]> = blocks.iter().map(|block| [&block.value[..]]).collect();
                let puts: Vec<BlockPut<'_>> = blocks
                    .iter()
                    .zip(&parts)
                    .map(|(block, parts)| BlockPut {
                        key: &block.key,
                        parts,
                        links: Links { parent: block.parent.as_deref(), group: block.group.as_deref() },
                    })
                    .collect();
                client.batch_put_blocks(&puts, options)
            })
            .await;
        result.unwrap_or_else(|error| vec![Err(error); count])
    }

    /// Subscribes to the node's events for keys starting with `prefix` (all for `None`); the stream is read
    /// on threads of its own (see [`crate::EventStream`]).
    pub async fn subscribe_events(&self, prefix: Option<Vec<u8>>) -> Result<crate::EventStream, ClientError> {
        self.call(move |client| client.subscribe_events(prefix.as_deref())).await?
    }

    /// Removes every key that matches `pattern` (a regular expression); returns how many.
    pub async fn remove_matching(&self, pattern: String) -> Result<u64, ClientError> {
        self.call(move |client| client.remove_matching(&pattern)).await?
    }

    /// Whether `key` is stored.
    pub async fn exists(&self, key: Vec<u8>) -> Result<bool, ClientError> {
        self.call(move |client| client.exists(&key)).await?
    }

    /// Removes `key`.
    pub async fn remove(&self, key: Vec<u8>) -> Result<(), ClientError> {
        self.call(move |client| client.remove(&key)).await?
    }

    /// Stores every `(key, value)`; a result per key.
    pub async fn batch_put(&self, items: Vec<(Vec<u8>, Vec<u8>)>, options: PutOptions) -> Vec<Result<(), ClientError>> {
        let count = items.len();
        let result = self
            .call(move |client| {
                let refs: Vec<(&[u8], &[u8])> = items.iter().map(|(key, value)| (&key[..], &value[..])).collect();
                client.batch_put_with(&refs, options)
            })
            .await;
        result.unwrap_or_else(|error| vec![Err(error); count])
    }

    /// Reads every key; a result per key.
    pub async fn batch_get(&self, keys: Vec<Vec<u8>>) -> Vec<Result<Vec<u8>, ClientError>> {
        let count = keys.len();
        let result =
            self.call(move |client| client.batch_get(&keys.iter().map(Vec::as_slice).collect::<Vec<_>>())).await;
        result.unwrap_or_else(|error| vec![Err(error); count])
    }

    /// Reads every key into its buffer; gives the buffers back with a result (the value's length) per key.
    pub async fn batch_get_into(
        &self,
        keys: Vec<Vec<u8>>,
        buffers: Vec<Vec<u8>>,
    ) -> (Vec<Vec<u8>>, Vec<Result<usize, ClientError>>) {
        let count = keys.len();
        let work = move |client: &mut Client, buffers: &mut Vec<Vec<u8>>| {
            let key_refs: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let mut slices: Vec<&mut [u8]> = buffers.iter_mut().map(|buffer| &mut buffer[..]).collect();
            client.batch_get_into(&key_refs, &mut slices)
        };
        self.call_with(buffers, work, || vec![Err(gone()); count]).await
    }

    /// Whether each key is stored; a result per key.
    pub async fn batch_exists(&self, keys: Vec<Vec<u8>>) -> Vec<Result<bool, ClientError>> {
        let count = keys.len();
        let result =
            self.call(move |client| client.batch_exists(&keys.iter().map(Vec::as_slice).collect::<Vec<_>>())).await;
        result.unwrap_or_else(|error| vec![Err(error); count])
    }

    /// The length of `key`'s value.
    pub async fn get_size(&self, key: Vec<u8>) -> Result<u64, ClientError> {
        self.call(move |client| client.get_size(&key)).await?
    }

    /// How many leading keys of each chain are stored; a result per chain, one round trip per shard in all.
    pub async fn batch_prefix_match(&self, chains: Vec<Vec<Vec<u8>>>) -> Vec<Result<usize, ClientError>> {
        let count = chains.len();
        let result = self
            .call(move |client| {
                let keys: Vec<Vec<&[u8]>> =
                    chains.iter().map(|chain| chain.iter().map(Vec::as_slice).collect()).collect();
                let refs: Vec<&[&[u8]]> = keys.iter().map(Vec::as_slice).collect();
                client.batch_prefix_match(&refs)
            })
            .await;
        result.unwrap_or_else(|error| vec![Err(error); count])
    }

    /// Stores one value sent from several buffers in order (one per layer, say) under `key`; gives the
    /// buffers back.
    pub async fn put_parts(
        &self,
        key: Vec<u8>,
        parts: Vec<Vec<u8>>,
        options: PutOptions,
    ) -> (Vec<Vec<u8>>, Result<(), ClientError>) {
        let work = move |client: &mut Client, parts: &mut Vec<Vec<u8>>| {
            let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            client.put_parts(&key, &refs, options)
        };
        self.call_with(parts, work, || Err(gone())).await
    }

    /// Reads `key`'s value into several buffers in order (one per layer, say), straight from the socket;
    /// gives them back with the value's length.
    pub async fn get_into_parts(
        &self,
        key: Vec<u8>,
        parts: Vec<Vec<u8>>,
    ) -> (Vec<Vec<u8>>, Result<usize, ClientError>) {
        let work = move |client: &mut Client, parts: &mut Vec<Vec<u8>>| {
            let mut slices: Vec<&mut [u8]> = parts.iter_mut().map(|part| &mut part[..]).collect();
            client.get_into_parts(&key, &mut slices)
        };
        self.call_with(parts, work, || Err(gone())).await
    }

    /// Gathers `(key, offset, length)` ranges into `destination`, back to back in the order given (see
    /// [`Client::gather_into`]); gives it back with a result (the bytes read) per range.
    pub async fn gather_into(
        &self,
        ranges: Vec<(Vec<u8>, u32, u32)>,
        destination: Vec<u8>,
    ) -> (Vec<u8>, Vec<Result<usize, ClientError>>) {
        self.gather_into_waiting(ranges, destination, std::time::Duration::ZERO).await
    }

    /// [`gather_into`](Self::gather_into) from keys that may not be stored yet, each waited for up to `wait`
    /// (see [`Client::gather_into_waiting`]).
    pub async fn gather_into_waiting(
        &self,
        ranges: Vec<(Vec<u8>, u32, u32)>,
        destination: Vec<u8>,
        wait: std::time::Duration,
    ) -> (Vec<u8>, Vec<Result<usize, ClientError>>) {
        let count = ranges.len();
        let work = move |client: &mut Client, destination: &mut Vec<u8>| {
            let refs: Vec<KeyRange<'_>> = ranges.iter().map(|(key, offset, len)| (&key[..], *offset, *len)).collect();
            client.gather_into_waiting(&refs, destination, wait)
        };
        self.call_with(destination, work, || vec![Err(gone()); count]).await
    }

    /// Stores consecutive pieces of `source` as the values of the keys given, in order (`(key, length)`;
    /// see [`Client::scatter_put`]); gives `source` back with a result per key.
    pub async fn scatter_put(
        &self,
        source: Vec<u8>,
        pieces: Vec<(Vec<u8>, usize)>,
        options: PutOptions,
    ) -> (Vec<u8>, Vec<Result<(), ClientError>>) {
        let count = pieces.len();
        let work = move |client: &mut Client, source: &mut Vec<u8>| {
            let refs: Vec<(&[u8], usize)> = pieces.iter().map(|(key, len)| (&key[..], *len)).collect();
            client.scatter_put(source, &refs, options)
        };
        self.call_with(source, work, || vec![Err(gone()); count]).await
    }

    /// Starts a put whose value comes in parts of the lengths announced (one per layer, say), each readable
    /// by ranged reads as soon as it arrived (see [`Client::put_progressive`]). The parts are sent from the
    /// client's I/O thread, in the order of [`AsyncProgressivePut::send_part`] calls.
    pub async fn put_progressive(
        &self,
        key: Vec<u8>,
        part_lens: Vec<u32>,
        parent: Option<Vec<u8>>,
        group: Option<Vec<u8>>,
        options: PutOptions,
    ) -> Result<AsyncProgressivePut<'_>, ClientError> {
        let put = self
            .call(move |client| {
                let links = Links { parent: parent.as_deref(), group: group.as_deref() };
                client.put_progressive(&key, &part_lens, links, options)
            })
            .await??;
        Ok(AsyncProgressivePut { client: self, sent: 0, count: put.part_count(), put: Some(put) })
    }

    /// Removes every key; a result per key.
    pub async fn batch_remove(&self, keys: Vec<Vec<u8>>) -> Vec<Result<(), ClientError>> {
        let count = keys.len();
        let result =
            self.call(move |client| client.batch_remove(&keys.iter().map(Vec::as_slice).collect::<Vec<_>>())).await;
        result.unwrap_or_else(|error| vec![Err(error); count])
    }
}

/// A progressive put of an [`AsyncClient`]: the parts go out on the client's I/O thread, which owns the
/// put between calls. Dropping it unfinished closes its connection, and the node drops the partial object.
pub struct AsyncProgressivePut<'c> {
    client: &'c AsyncClient,
    /// `None` only while a call has it on the I/O thread, or after that thread went away.
    put: Option<ProgressivePut>,
    sent: usize,
    count: usize,
}

impl AsyncProgressivePut<'_> {
    /// Sends the next part (its length must be the one announced) and gives its buffer back.
    pub async fn send_part(&mut self, part: Vec<u8>) -> (Vec<u8>, Result<(), ClientError>) {
        let Some(put) = self.put.take() else {
            return (part, Err(gone()));
        };
        let ((part, put), result) = self
            .client
            .call_with(
                (part, Some(put)),
                |_, (part, put)| put.as_mut().map_or_else(|| Err(gone()), |put| put.send_part(part)),
                || Err(gone()),
            )
            .await;
        if result.is_ok() {
            self.sent += 1;
        }
        self.put = put;
        (part, result)
    }

    /// Parts sent so far.
    pub fn parts_sent(&self) -> usize {
        self.sent
    }

    /// Parts announced.
    pub fn part_count(&self) -> usize {
        self.count
    }

    /// Waits for the node's answer once every part is sent: stored, or why not.
    pub async fn finish(mut self) -> Result<(), ClientError> {
        let put = self.put.take().ok_or_else(gone)?;
        self.client.call(move |_| put.finish()).await?
    }
}

impl Drop for AsyncClient {
    fn drop(&mut self) {
        // Closing the queue ends the I/O thread once the calls already queued are done.
        drop(self.jobs.take());
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

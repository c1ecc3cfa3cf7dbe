//! Reading a streamed head's slices ahead of the pass: one helper thread
//! that reads into the buffers it is handed.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use arbor_paging::{AlignedBuf, DirectReader, PagingError};
use crossbeam_channel::{Receiver, Sender};

/// A finished read: its buffer, where the rows start in it (or why the
/// read failed), and when it began and ended.
pub(super) struct Fetched {
    pub(super) buf: AlignedBuf,
    pub(super) start: Result<usize, PagingError>,
    pub(super) began: Instant,
    pub(super) ended: Instant,
}

/// Reads `len` bytes at `offset` into `buf`, on whichever thread calls.
pub(super) fn fetch(
    reader: &DirectReader,
    offset: u64,
    len: usize,
    mut buf: AlignedBuf,
) -> Fetched {
    let began = Instant::now();
    // Where the bytes landed: read_into may have grown the buffer, so its
    // start is taken after the read.
    let at = reader
        .read_into(offset, len, &mut buf)
        .map(|got| got.as_ptr() as usize);
    let start = at.map(|at| at - buf.as_slice().as_ptr() as usize);
    Fetched {
        buf,
        start,
        began,
        ended: Instant::now(),
    }
}

/// A read asked of the helper.
struct Job {
    offset: u64,
    len: usize,
    buf: AlignedBuf,
}

/// The helper thread: reads one job at a time, in the order asked, and
/// hands each back finished. It ends when its head drops it.
pub(super) struct Helper {
    jobs: Option<Sender<Job>>,
    done: Receiver<Fetched>,
    thread: Option<JoinHandle<()>>,
}

impl Helper {
    /// Starts the thread; `None` where the system refuses one (the head
    /// then reads when asked).
    pub(super) fn spawn(reader: Arc<DirectReader>) -> Option<Helper> {
        let (jobs, todo) = crossbeam_channel::unbounded::<Job>();
        let (finished, done) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("arbor-head-read".into())
            .spawn(move || {
                for job in todo {
                    let f = fetch(&reader, job.offset, job.len, job.buf);
                    if finished.send(f).is_err() {
                        break;
                    }
                }
            })
            .ok()?;
        Some(Helper {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }

    /// Asks for a read; the buffer comes back if the thread is gone.
    pub(super) fn submit(
        &self,
        offset: u64,
        len: usize,
        buf: AlignedBuf,
    ) -> Result<(), AlignedBuf> {
        match &self.jobs {
            Some(jobs) => jobs
                .send(Job { offset, len, buf })
                .map_err(|e| e.into_inner().buf),
            None => Err(buf),
        }
    }

    /// Waits for the oldest read asked; `None` if the thread died first.
    pub(super) fn wait(&self) -> Option<Fetched> {
        self.done.recv().ok()
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        // Closing the queue ends the thread once its read is done.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

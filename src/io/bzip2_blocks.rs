//! bzip2 decoded on every core. A bzip2 file is one or more streams (`BZh` + block-size digit,
//! blocks, an end-of-stream marker + the stream's combined CRC), and each block starts with a
//! 48-bit magic at any bit position, not only on a byte. [`ParallelBzDecoder`] finds the
//! magics, decodes each block as the one block of a stream built around it, many at once on the
//! rayon pool, and gives the text in order: the bytes `bzip2 -dc` gives, checked by the same
//! CRCs (each block's by the decoder, each stream's combined one here). The 48-bit pattern may
//! also turn up inside a block's data (either magic about once in 17 TB of compressed data); a
//! block cut there fails to decode and is decoded again together with the piece after it. A
//! block that still fails ([`MAX_JOINS`]) is damaged, or crafted with many false magics: the
//! rest of the file is then decoded one block after another, by `bzip2`'s own decoder, which
//! reads a valid file whatever its blocks hold and fails a damaged one as `bzip2 -dc` does.
//! Memory: the blocks in flight, 4 per thread of the pool, at most 900 kB compressed each (and
//! their text, about as much for captions; up to 45 MB for a block of one byte repeated).

use std::collections::VecDeque;
use std::io::{self, Read, Seek, SeekFrom};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

/// The magic that starts each block (the digits of pi).
const BLOCK_MAGIC: u64 = 0x3141_5926_5359;
/// The magic that ends a stream (the digits of sqrt(pi)), before the combined CRC.
const END_MAGIC: u64 = 0x1772_4538_5090;
/// A magic and the CRC after it, in bits.
const MARK_BITS: u64 = 48 + 32;
/// `BZh` + block-size digit + a magic: what starts every stream, in bytes.
const STREAM_HEAD_BYTES: u64 = 10;
/// Compressed bytes read from the file at a time.
const READ_BYTES: usize = 4 << 20;
/// Pieces decoded at once, per thread of the pool: enough to keep every thread busy while the
/// blocks before them are read.
const PIECES_PER_THREAD: usize = 2;
/// Pieces joined to a block that does not decode before it is decoded one block after another
/// instead ([`decode_sequentially`]): one false magic in a block takes one join, and a block
/// damaged, or crafted with many false magics, costs little more than decoding it.
const MAX_JOINS: u8 = 2;
/// The longest a block's compressed data can be, with room to spare: a block holds at most
/// 900 kB, and its Huffman codes average under 9.1 bits a symbol (258 symbols), so it takes
/// about 1 MB at worst. A piece that still fails to decode when it is this long is damage, not
/// a block cut at a false magic, and a block that has not ended by then is not bzip2 data.
const MAX_BLOCK_BITS: u64 = 8 << 21;

/// What the decoding thread sends: text in order, then `Done` or `Failed`.
enum Message {
    Text(Vec<u8>),
    Done,
    Failed(io::Error),
}

/// Reads the text of a bzip2 file, decoded in parallel (see the module docs). Several streams
/// one after another (as `cat a.bz2 b.bz2` or parallel compressors make) read as one text;
/// anything after the last stream is an error, as is a damaged or cut file.
pub struct ParallelBzDecoder {
    /// (In a `Mutex` so that the reader is `Sync`; only `get_mut` is used, never a lock.)
    channel: Mutex<Channel>,
    text: Vec<u8>,
    pos: usize,
    /// How the stream ended, once it has: every later read says the same.
    end: Option<Result<(), (io::ErrorKind, String)>>,
    /// Set when the reader is dropped (often after a file's first lines): the decoding thread
    /// stops before its next blocks instead of decoding them for nobody.
    dropped: Arc<AtomicBool>,
}

struct Channel {
    rx: Receiver<Message>,
    /// Told once the first block's text has been read through: only then does the decoding
    /// thread go on, so that a look at a file's first lines decodes one block of it.
    more: Option<SyncSender<()>>,
}

impl Drop for ParallelBzDecoder {
    fn drop(&mut self) {
        self.dropped.store(true, Ordering::Relaxed);
    }
}

impl ParallelBzDecoder {
    /// Starts decoding `src` (a file, read from its start) on a thread of its own, which hands
    /// the blocks to the rayon pool; it stops when the reader is dropped.
    pub fn new<R: Read + Seek + Send + 'static>(src: R) -> io::Result<ParallelBzDecoder> {
        let in_flight = rayon::current_num_threads().max(1) * PIECES_PER_THREAD;
        let (tx, rx) = sync_channel(in_flight);
        let (more, wants_more) = sync_channel(1);
        let dropped = Arc::new(AtomicBool::new(false));
        let stop = dropped.clone();
        std::thread::Builder::new().name("curate-bunzip2".into()).spawn(move || {
            let to = Sink { tx, wants_more, stop };
            let message = match decode_events(&mut Parser::new(src), &mut VecDeque::new(), &to, in_flight) {
                Ok(()) => Message::Done,
                Err(e) => Message::Failed(e),
            };
            let _ = to.tx.send(message);
        })?;
        let channel = Mutex::new(Channel { rx, more: Some(more) });
        Ok(ParallelBzDecoder { channel, text: Vec::new(), pos: 0, end: None, dropped })
    }
}

impl Read for ParallelBzDecoder {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.text.len() {
            if let Some(end) = &self.end {
                return match end {
                    Ok(()) => Ok(0),
                    Err((kind, msg)) => Err(io::Error::new(*kind, msg.clone())),
                };
            }
            let channel = self.channel.get_mut().unwrap_or_else(|e| e.into_inner());
            if self.pos > 0 {
                if let Some(more) = channel.more.take() {
                    let _ = more.send(());
                }
            }
            match super::recv_in_pool(&channel.rx) {
                Some(Message::Text(t)) => {
                    self.text = t;
                    self.pos = 0;
                }
                Some(Message::Done) => self.end = Some(Ok(())),
                Some(Message::Failed(e)) => self.end = Some(Err((e.kind(), e.to_string()))),
                None => self.end = Some(Err((io::ErrorKind::Other, "the bzip2 decoding thread stopped".into()))),
            }
        }
        let n = buf.len().min(self.text.len() - self.pos);
        buf[..n].copy_from_slice(&self.text[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Where a stream starts in the file (its `BZh`, a byte offset) and its block-size digit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stream {
    at: u64,
    level: u8,
}

/// The compressed bits of one block, `start..end` (bit positions in the file, from the block's
/// magic to the next magic), its stream, and how many pieces after it were joined to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Piece {
    start: u64,
    end: u64,
    stream: Stream,
    joins: u8,
}

/// What the file holds, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Event {
    Piece(Piece),
    /// A stream ends, with the combined CRC it stores.
    StreamEnd(u32),
}

/// Where the decoding thread sends the text, and what it hears from the reader.
struct Sink {
    tx: SyncSender<Message>,
    /// A message once the reader wants more than the first block (see [`Channel::more`]).
    wants_more: Receiver<()>,
    /// Set when the reader is dropped.
    stop: Arc<AtomicBool>,
}

impl Sink {
    /// Sends `text`; `false` once the reader is gone.
    fn send(&self, text: Vec<u8>) -> bool {
        !self.stop.load(Ordering::Relaxed) && self.tx.send(Message::Text(text)).is_ok()
    }
}

/// A piece's text and its block's CRC.
type Decoded = io::Result<(Vec<u8>, u32)>;

fn damaged(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Decodes `events`, then everything `parser` finds after them, sending the text to `to` in
/// order, `in_flight` pieces at most at once (the first block alone, then more as the reader
/// asks), until the file ends or the reader is gone.
fn decode_events<R: Read + Seek>(
    parser: &mut Parser<R>,
    events: &mut VecDeque<Event>,
    to: &Sink,
    in_flight: usize,
) -> io::Result<()> {
    let mut combined: u32 = 0;
    // Text sent since the current stream started.
    let mut sent_in_stream: u64 = 0;
    let mut batch_pieces = 1;
    // Whether text has been sent, and the reader has asked for more than the first of it.
    let (mut sent, mut asked) = (false, false);
    loop {
        if sent && !asked {
            if to.wants_more.recv().is_err() {
                return Ok(());
            }
            asked = true;
        }
        while pieces(events) < batch_pieces && parser.parse_more(events)? {}
        if events.is_empty() {
            return Ok(());
        }
        // The leading events, with at most `batch_pieces` pieces among them.
        let mut n = 0;
        let mut seen = 0;
        while n < events.len() {
            if matches!(events[n], Event::Piece(_)) {
                if seen == batch_pieces {
                    break;
                }
                seen += 1;
            }
            n += 1;
        }
        let batch: Vec<Event> = events.drain(..n).collect();
        let (buf, base) = (&parser.buf, parser.base);
        let decoded: Vec<Option<Decoded>> = batch
            .par_iter()
            .map(|e| match e {
                Event::Piece(p) => Some(decode_piece(buf, base, p)),
                Event::StreamEnd(_) => None,
            })
            .collect();
        for (i, (event, result)) in batch.iter().zip(decoded).enumerate() {
            match (event, result) {
                (Event::StreamEnd(stored), _) => {
                    if combined != *stored {
                        return Err(damaged(format!(
                            "a stream's combined CRC is {stored:08x}, its blocks give {combined:08x}"
                        )));
                    }
                    combined = 0;
                    sent_in_stream = 0;
                }
                (Event::Piece(_), Some(Ok((text, crc)))) => {
                    combined = combined.rotate_left(1) ^ crc;
                    sent_in_stream += text.len() as u64;
                    sent = true;
                    if !to.send(text) {
                        // The reader is gone: nobody wants the rest.
                        return Ok(());
                    }
                }
                (Event::Piece(p), Some(Err(_))) => {
                    // Perhaps a false magic cut this block: join it to the piece after it
                    // and decode the two again (with the rest of the batch after them).
                    for later in batch[i..].iter().rev() {
                        events.push_front(*later);
                    }
                    while events.len() < 2 && parser.parse_more(events)? {}
                    match events.get(1) {
                        Some(Event::Piece(next)) if p.joins < MAX_JOINS && next.end - p.start <= MAX_BLOCK_BITS => {
                            let joined = Piece { end: next.end, joins: p.joins + 1, ..*p };
                            events.drain(..2);
                            events.push_front(Event::Piece(joined));
                        }
                        _ => return decode_sequentially(&mut parser.src, p.stream.at, sent_in_stream, to),
                    }
                    break;
                }
                (Event::Piece(_), None) => unreachable!("every piece is decoded"),
            }
        }
        batch_pieces = (batch_pieces * 2).min(in_flight);
    }
}

/// The rest of the file decoded one block after another (by `bzip2`'s own multi-stream
/// decoder), from the stream starting at byte `at`, less the first `skip` bytes of its text
/// (sent already): for a block that does not decode even joined to the pieces after it. The
/// decoder finds where its blocks end, whatever magics their data holds, and says what is
/// wrong with a damaged one as `bzip2 -dc` does.
fn decode_sequentially<R: Read + Seek>(src: &mut R, at: u64, skip: u64, to: &Sink) -> io::Result<()> {
    src.seek(SeekFrom::Start(at))?;
    let mut decoder = bzip2::read::MultiBzDecoder::new(io::BufReader::with_capacity(1 << 20, src));
    let skipped = io::copy(&mut (&mut decoder).take(skip), &mut io::sink())?;
    if skipped < skip {
        return Err(damaged("a stream decodes to less text one block after another than in parallel"));
    }
    loop {
        let mut text = Vec::with_capacity(1 << 20);
        (&mut decoder).take(1 << 20).read_to_end(&mut text)?;
        if text.is_empty() {
            return Ok(());
        }
        if !to.send(text) {
            return Ok(());
        }
    }
}

fn pieces(events: &VecDeque<Event>) -> usize {
    events.iter().filter(|e| matches!(e, Event::Piece(_))).count()
}

/// Decodes one piece: its bits as the one block of a stream, whose combined CRC is then the
/// block's own CRC. Returns the text and the block's CRC.
fn decode_piece(buf: &[u8], base: u64, p: &Piece) -> Decoded {
    let crc = bits_at(buf, base, p.start + 48, 32) as u32;
    let stream = one_block_stream(buf, base, p, crc);
    let mut text = Vec::with_capacity(stream.len() * 4);
    bzip2::read::BzDecoder::new(stream.as_slice()).read_to_end(&mut text)?;
    Ok((text, crc))
}

/// `BZh` + digit, the piece's bits (moved to start on a byte), the end-of-stream magic and
/// `crc`, zero bits to the next byte.
fn one_block_stream(buf: &[u8], base: u64, p: &Piece, crc: u32) -> Vec<u8> {
    let bits = p.end - p.start;
    let first = (p.start / 8 - base) as usize;
    let shift = (p.start % 8) as u32;
    let whole = (bits / 8) as usize;
    let mut out = Vec::with_capacity(4 + whole + 12);
    out.extend_from_slice(b"BZh");
    out.push(p.stream.level);
    if shift == 0 {
        out.extend_from_slice(&buf[first..first + whole]);
    } else {
        out.extend(buf[first..first + whole + 1].windows(2).map(|w| w[0] << shift | w[1] >> (8 - shift)));
    }
    let rest = (bits % 8) as u32;
    let mut tail = bits_at(buf, base, p.start + 8 * whole as u64, rest) as u128;
    tail = (tail << 48 | END_MAGIC as u128) << 32 | crc as u128;
    let tail_bits = rest + 80;
    let padded = tail_bits.div_ceil(8) * 8;
    tail <<= padded - tail_bits;
    out.extend_from_slice(&tail.to_be_bytes()[16 - (padded / 8) as usize..]);
    out
}

/// The `n` bits (at most 56) at bit position `pos` of the file, of which `buf` holds the bytes
/// from byte `base` on; bytes past its end read as zeros.
fn bits_at(buf: &[u8], base: u64, pos: u64, n: u32) -> u64 {
    debug_assert!(n <= 56);
    if n == 0 {
        return 0;
    }
    let i = (pos / 8 - base) as usize;
    let mut word = [0u8; 8];
    let have = buf.len().saturating_sub(i).min(8);
    word[..have].copy_from_slice(&buf[i..i + have]);
    let w = u64::from_be_bytes(word);
    (w >> (64 - (pos % 8) as u32 - n)) & ((1u64 << n) - 1)
}

/// Which magic a 48-bit value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    Block,
    End,
}

/// By the byte 2 after where a magic's first byte would be (a byte the magic covers whole,
/// whatever its bit offset): bit `2 * offset + (0 block, 1 end)` is set where that magic at
/// that offset has this byte there. Most bytes rule out every candidate with one lookup.
fn candidate_table() -> [u16; 256] {
    let mut t = [0u16; 256];
    for offset in 0..8 {
        for (k, magic) in [BLOCK_MAGIC, END_MAGIC].into_iter().enumerate() {
            t[((magic >> (24 + offset)) & 0xff) as usize] |= 1 << (2 * offset + k);
        }
    }
    t
}

/// Reads the file and cuts it into [`Event`]s.
struct Parser<R> {
    src: R,
    /// Bytes of the file from byte `base` on.
    buf: Vec<u8>,
    base: u64,
    eof: bool,
    state: State,
    table: [u16; 256],
}

#[derive(Debug, Clone, Copy)]
enum State {
    /// A stream (or the end of the file) starts at this bit position, on a byte.
    StreamStart(u64),
    /// A block of `stream` starts at `start`; the next magic is searched for from `search`.
    /// `false_end`: an end-of-stream magic was passed over, as no stream or file end came after
    /// it.
    Block {
        stream: Stream,
        start: u64,
        search: u64,
        false_end: bool,
    },
    Done,
}

impl<R: Read> Parser<R> {
    fn new(src: R) -> Self {
        Parser { src, buf: Vec::new(), base: 0, eof: false, state: State::StreamStart(0), table: candidate_table() }
    }

    /// Bit position just past the bytes read so far.
    fn end_bits(&self) -> u64 {
        (self.base + self.buf.len() as u64) * 8
    }

    /// Reads more of the file, first dropping the bytes before `keep` (a bit position) once
    /// they are half the buffer. `false` at the end of the file.
    fn read_more(&mut self, keep: u64) -> io::Result<bool> {
        let drop = (keep / 8).saturating_sub(self.base) as usize;
        if drop > 0 && drop >= self.buf.len() / 2 {
            self.buf.drain(..drop);
            self.base += drop as u64;
        }
        let old = self.buf.len();
        self.buf.resize(old + READ_BYTES, 0);
        let n = loop {
            match self.src.read(&mut self.buf[old..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.buf.truncate(old);
                    return Err(e);
                }
            }
        };
        self.buf.truncate(old + n);
        self.eof = n == 0;
        Ok(n > 0)
    }

    /// Reads until the bytes before byte `end` are in, or the file ends. Whether they are.
    fn have_bytes(&mut self, end: u64, keep: u64) -> io::Result<bool> {
        while self.base + (self.buf.len() as u64) < end {
            if self.eof || !self.read_more(keep)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The first magic at a bit position in `from..to` among the bytes read.
    fn find_mark(&self, from: u64, to: u64) -> Option<(u64, Mark)> {
        let first = (from / 8).saturating_sub(self.base) as usize;
        // The lookup byte is 2 after a candidate's first byte.
        let last = self.buf.len().saturating_sub(2);
        for i in first..last {
            let mut m = self.table[self.buf[i + 2] as usize];
            while m != 0 {
                let bit = m.trailing_zeros();
                m &= m - 1;
                let pos = (self.base + i as u64) * 8 + (bit / 2) as u64;
                if pos < from || pos >= to {
                    continue;
                }
                let (magic, mark) =
                    if bit.is_multiple_of(2) { (BLOCK_MAGIC, Mark::Block) } else { (END_MAGIC, Mark::End) };
                if bits_at(&self.buf, self.base, pos, 48) == magic {
                    return Some((pos, mark));
                }
            }
            if (self.base + i as u64) * 8 >= to {
                break;
            }
        }
        None
    }

    /// Whether a stream may start at byte `at`: `BZh`, a digit and a magic, or the file's end.
    /// Reads ahead as needed. `Some(digit)` for a stream, `Some(0)` for the end of the file.
    fn stream_at(&mut self, at: u64, keep: u64) -> io::Result<Option<u8>> {
        if !self.have_bytes(at + STREAM_HEAD_BYTES, keep)? {
            let end = self.base + self.buf.len() as u64;
            return Ok((end == at).then_some(0));
        }
        let i = (at - self.base) as usize;
        let head = &self.buf[i..self.buf.len().min(i + STREAM_HEAD_BYTES as usize)];
        if head.len() < STREAM_HEAD_BYTES as usize || !head.starts_with(b"BZh") || !(b'1'..=b'9').contains(&head[3]) {
            return Ok(None);
        }
        let magic = bits_at(&self.buf, self.base, at * 8 + 32, 48);
        Ok((magic == BLOCK_MAGIC || magic == END_MAGIC).then_some(head[3]))
    }

    /// The first bit position still needed: the first pending event's, or the parser's own.
    fn keep(&self, events: &VecDeque<Event>) -> u64 {
        let own = match self.state {
            State::StreamStart(at) => at,
            State::Block { start, .. } => start,
            State::Done => self.end_bits(),
        };
        let first_piece = events.iter().find_map(|e| if let Event::Piece(p) = e { Some(p.start) } else { None });
        first_piece.map_or(own, |p| p.min(own))
    }

    /// Appends the next event(s) to `events`; `false` once the file is done.
    fn parse_more(&mut self, events: &mut VecDeque<Event>) -> io::Result<bool> {
        loop {
            let keep = self.keep(events);
            match self.state {
                State::Done => return Ok(false),
                State::StreamStart(at) => {
                    let at_byte = at / 8;
                    match self.stream_at(at_byte, keep)? {
                        Some(0) if at > 0 => {
                            self.state = State::Done;
                            return Ok(false);
                        }
                        Some(0) => return Err(damaged("the file is empty")),
                        Some(level) => {
                            let stream = Stream { at: at_byte, level };
                            let mark = at + 32;
                            if bits_at(&self.buf, self.base, mark, 48) == END_MAGIC {
                                // An empty stream.
                                self.have_bytes((mark + MARK_BITS).div_ceil(8), keep)?;
                                let stored = bits_at(&self.buf, self.base, mark + 48, 32) as u32;
                                events.push_back(Event::StreamEnd(stored));
                                self.state = State::StreamStart((mark + MARK_BITS).div_ceil(8) * 8);
                                return Ok(true);
                            }
                            self.state =
                                State::Block { stream, start: mark, search: mark + MARK_BITS, false_end: false };
                        }
                        None if at == 0 => return Err(damaged("the file does not start as bzip2 data")),
                        None => return Err(damaged("bytes after the last stream are not bzip2 data")),
                    }
                }
                State::Block { stream, start, search, false_end } => {
                    // Only magics with their CRC in the bytes read count.
                    let to = self.end_bits().saturating_sub(MARK_BITS) + 1;
                    match self.find_mark(search, to) {
                        Some((pos, Mark::Block)) => {
                            events.push_back(Event::Piece(Piece { start, end: pos, stream, joins: 0 }));
                            // From just past this magic: a real one may follow a false one
                            // within its 80 bits.
                            self.state = State::Block { stream, start: pos, search: pos + 1, false_end: false };
                            return Ok(true);
                        }
                        Some((pos, Mark::End)) => {
                            // A stream's end is followed by another stream or the file's end.
                            let next = (pos + MARK_BITS).div_ceil(8) * 8;
                            if self.stream_at(next / 8, keep)?.is_none() {
                                self.state = State::Block { stream, start, search: pos + 1, false_end: true };
                                continue;
                            }
                            let stored = bits_at(&self.buf, self.base, pos + 48, 32) as u32;
                            events.push_back(Event::Piece(Piece { start, end: pos, stream, joins: 0 }));
                            events.push_back(Event::StreamEnd(stored));
                            self.state = State::StreamStart(next);
                            return Ok(true);
                        }
                        None => {
                            self.state = State::Block { stream, start, search: search.max(to), false_end };
                            // No block is this long: what follows is not bzip2 data (and is
                            // not read into memory to the end of the file).
                            let too_long = to.saturating_sub(start) > MAX_BLOCK_BITS;
                            if too_long || self.eof || !self.read_more(keep)? {
                                return Err(damaged(if false_end {
                                    "bytes after the last stream are not bzip2 data (or a stream's end is damaged)"
                                } else if too_long {
                                    "no block ends within 2 MiB of where it starts"
                                } else {
                                    "the file ends inside a stream"
                                }));
                            }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn compress(data: &[u8], level: u32) -> Vec<u8> {
        let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::new(level));
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    /// Text of many lines, some repetitive, some not, so that blocks differ in size.
    fn text(n: usize, seed: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut x = seed;
        for i in 0..n {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let words = (x >> 59) as usize + 1;
            write!(out, "{i}\t").unwrap();
            for w in 0..words {
                write!(out, "w{} ", x.rotate_right(w as u32 * 3) % 5000).unwrap();
            }
            out.push(b'\n');
        }
        out
    }

    fn decode(data: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        ParallelBzDecoder::new(std::io::Cursor::new(data.to_vec()))?.read_to_end(&mut out)?;
        Ok(out)
    }

    fn reference(data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        bzip2::read::MultiBzDecoder::new(data).read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn many_blocks_and_streams_decode_as_the_sequential_decoder_does() {
        // Level 1: 100 kB blocks, so 2 MB of text is about 20 blocks.
        let a = text(60_000, 1);
        let one = compress(&a, 1);
        assert_eq!(decode(&one).unwrap(), a);
        assert!(a.len() > 10 * 100_000, "several blocks");
        // Streams of different block sizes one after another, an empty stream among them.
        let b = text(5_000, 2);
        let mut several = one.clone();
        several.extend(compress(b"", 9));
        several.extend(compress(&b, 9));
        several.extend(compress(b"x", 3));
        let got = decode(&several).unwrap();
        assert_eq!(got, reference(&several));
        assert_eq!(got.len(), a.len() + b.len() + 1);
        assert_eq!(decode(&compress(b"", 9)).unwrap(), b"");
    }

    #[test]
    fn a_block_cut_at_a_false_magic_is_decoded_whole() {
        let a = text(30_000, 3);
        let data = compress(&a, 1);
        let mut parser = Parser::new(std::io::Cursor::new(data.clone()));
        let mut events = VecDeque::new();
        while parser.parse_more(&mut events).unwrap() {}
        let blocks: Vec<Piece> =
            events.iter().filter_map(|e| if let Event::Piece(p) = e { Some(*p) } else { None }).collect();
        assert!(blocks.len() >= 4);
        let cut = |p: &Piece, at: u64| (Piece { end: at, ..*p }, Piece { start: at, ..*p });
        // A block cut in two does not decode, neither half; joined, it does.
        let (x, y) = cut(&blocks[1], blocks[1].start + 12_345);
        assert!(decode_piece(&parser.buf, parser.base, &x).is_err());
        assert!(decode_piece(&parser.buf, parser.base, &y).is_err());
        let (whole, _) = decode_piece(&parser.buf, parser.base, &blocks[1]).unwrap();
        assert!(!whole.is_empty());
        // Through the decoder: the events as a false magic in blocks 1 and 3 would make them.
        let mut fake = Vec::new();
        for (i, p) in blocks.iter().enumerate() {
            if i == 1 || i == 3 {
                let (x, y) = cut(p, p.start + (p.end - p.start) / 3);
                fake.extend([Event::Piece(x), Event::Piece(y)]);
            } else {
                fake.push(Event::Piece(*p));
            }
        }
        fake.extend(events.iter().filter(|e| matches!(e, Event::StreamEnd(_))));
        let (tx, rx) = sync_channel(1000);
        let (more, wants_more) = sync_channel(1);
        more.send(()).unwrap();
        let mut parser = Parser::new(std::io::Cursor::new(data.clone()));
        parser.have_bytes(data.len() as u64, 0).unwrap();
        parser.state = State::Done;
        let mut queue: VecDeque<Event> = fake.into();
        let sink = Sink { tx, wants_more, stop: Arc::new(AtomicBool::new(false)) };
        decode_events(&mut parser, &mut queue, &sink, 4).unwrap();
        drop(sink);
        let got: Vec<u8> = rx.iter().flat_map(|m| if let Message::Text(t) = m { t } else { Vec::new() }).collect();
        assert_eq!(got, a);
    }

    #[test]
    fn files_with_magics_inside_their_blocks_decode() {
        // Valid files crafted with magics in their blocks' data (tests/fixtures/bzip2): one
        // just before a real magic, one in the middle of a block, 300 in one block (decoded one
        // block after another once two joins do not do).
        for name in ["near_end", "near_next", "middle", "many"] {
            let path = format!("{}/tests/fixtures/bzip2/{name}.bz2", env!("CARGO_MANIFEST_DIR"));
            let data = std::fs::read(path).unwrap();
            let mut parser = Parser::new(std::io::Cursor::new(data.clone()));
            let mut events = VecDeque::new();
            while parser.parse_more(&mut events).unwrap() {}
            let real_blocks = if name == "near_end" || name == "many" { 1 } else { 2 };
            assert!(pieces(&events) > real_blocks, "{name}: the false magics are found");
            assert_eq!(decode(&data).unwrap(), reference(&data), "{name}");
        }
    }

    #[test]
    fn damage_and_cuts_and_trailing_bytes_are_errors() {
        let a = text(20_000, 4);
        let data = compress(&a, 1);
        let mut flipped = data.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0x10;
        assert!(decode(&flipped).is_err());
        for cut in [data.len() - 1, data.len() - 5, data.len() / 3, 11, 4] {
            let e = decode(&data[..cut]).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "cut at {cut}: {e}");
        }
        for extra in [&b"\0\0\0\0"[..], b"hello", b"BZh9"] {
            let mut d = data.clone();
            d.extend_from_slice(extra);
            let e = decode(&d).unwrap_err();
            assert!(e.to_string().contains("after the last stream"), "{e}");
        }
        // The stored combined CRC (the last 4 bytes hold most of it) checked.
        let mut crc = data.clone();
        let n = crc.len();
        crc[n - 2] ^= 0x01;
        let e = decode(&crc).unwrap_err();
        assert!(e.to_string().contains("combined CRC"), "{e}");
        // Not bzip2 after a stream's start, or after its end: found without reading it all.
        let mut x = 99u64;
        let junk: Vec<u8> = (0..3 << 20)
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        let e = decode(&[&data[..10], &junk[..]].concat()).unwrap_err();
        assert!(e.to_string().contains("within 2 MiB"), "{e}");
        let e = decode(&[&data[..], &junk[..]].concat()).unwrap_err();
        assert!(e.to_string().contains("after the last stream"), "{e}");
        assert!(decode(b"").is_err());
        assert!(decode(b"plain text\n").unwrap_err().to_string().contains("does not start as bzip2"));
    }

    #[test]
    fn damaged_files_fail_where_the_sequential_decoder_fails() {
        // Three blocks and a second stream; bits flipped and bytes cut all over.
        let mut data = compress(&text(2_500, 5), 1);
        data.extend(compress(&text(500, 6), 9));
        let mut x = 17u64;
        for case in 0..48 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let at = (x >> 33) as usize % data.len();
            let mut d = data.clone();
            if case % 3 == 0 {
                d.truncate(at);
            } else {
                d[at] ^= 1 << ((x >> 20) % 8);
            }
            let mut want = Vec::new();
            let reference = bzip2::read::MultiBzDecoder::new(d.as_slice()).read_to_end(&mut want);
            match (decode(&d), reference) {
                (Ok(got), Ok(_)) => assert_eq!(got, want, "case {case}: byte {at}"),
                (Err(_), Err(_)) => {}
                (got, reference) => panic!("case {case}: byte {at}: {:?} but sequentially {reference:?}", got.err()),
            }
        }
    }

    #[test]
    fn magics_are_found_at_every_bit_offset() {
        let t = candidate_table();
        for offset in 0..8u64 {
            for (magic, mark) in [(BLOCK_MAGIC, Mark::Block), (END_MAGIC, Mark::End)] {
                let mut buf = vec![0xAAu8; 32];
                let pos = 8 * 5 + offset;
                for b in 0..48 {
                    let bit = (magic >> (47 - b)) & 1;
                    let at = (pos + b) as usize;
                    let mask = 0x80u8 >> (at % 8);
                    if bit == 1 {
                        buf[at / 8] |= mask;
                    } else {
                        buf[at / 8] &= !mask;
                    }
                }
                let p = Parser { src: std::io::empty(), buf, base: 0, eof: true, state: State::Done, table: t };
                assert_eq!(p.find_mark(0, 256), Some((pos, mark)), "offset {offset}");
                assert_eq!(p.find_mark(pos + 1, 256), None);
            }
        }
    }
}

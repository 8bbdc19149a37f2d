//! What the agent serves: [`live`], the trace socket (every trace record, as a JSON line, to
//! every client of a Unix socket).

pub mod live;

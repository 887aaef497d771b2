//! What the durability and shared-store benchmarks both measure: durable appends to one
//! task after another, and by 100 tasks at once, on any event log.

use std::sync::Arc;
use std::time::{Duration, Instant};

use brain::engine::log::EventLog;
use brain::model::event::{Event, ToolResult};

/// A small record, as a command's end is.
pub fn completed(i: u64) -> Event {
    Event::ToolCallCompleted {
        call_id: i,
        result: ToolResult {
            exit_code: Some(0),
            ..Default::default()
        },
    }
}

pub fn per_sec(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// `n` durable appends to one task, one after the other; appends per second.
pub async fn appends_one_task(log: Arc<dyn EventLog>, n: usize) -> f64 {
    let task = log.new_task_id().await.unwrap();
    let t = Instant::now();
    for i in 0..n as u64 {
        log.append(task, vec![completed(i)]).await.unwrap();
    }
    let rate = per_sec(n, t.elapsed());
    assert_eq!(log.last_seq(task).await.unwrap(), n as u64);
    rate
}

/// Durable appends by 100 tasks at once; appends per second.
pub async fn appends_hundred_tasks(log: Arc<dyn EventLog>, n: usize) -> f64 {
    let tasks = 100;
    let each = (n / 10).max(20);
    let mut ids = Vec::new();
    for _ in 0..tasks {
        ids.push(log.new_task_id().await.unwrap());
    }
    let t = Instant::now();
    let hs: Vec<_> = ids
        .iter()
        .map(|&id| {
            let log = log.clone();
            tokio::spawn(async move {
                for i in 0..each as u64 {
                    log.append(id, vec![completed(i)]).await.unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        h.await.unwrap();
    }
    let rate = per_sec(tasks * each, t.elapsed());
    for id in ids {
        assert_eq!(log.last_seq(id).await.unwrap(), each as u64);
    }
    rate
}

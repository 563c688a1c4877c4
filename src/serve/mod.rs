//! Serving GPT-2 on the pool: the model's weights as tensors and its step over a paged KV
//! cache ([`Gpt2`]), the cache's tensors ([`KvCache`]), and a server with continuous batching
//! and admission by predicted memory ([`Server`]). The bookkeeping it runs on (blocks, step
//! rows, request streams) is the pure [`crate::paging`] layer; the weights come from
//! [`crate::model`].
//!
//! ```no_run
//! use wgpu_pool::compute::{Context, ContextOptions, DType};
//! use wgpu_pool::model::{Gpt2Config, Gpt2Weights};
//! use wgpu_pool::paging::RequestSpec;
//! use wgpu_pool::serve::{Gpt2, Server, ServerOptions};
//! use wgpu_pool::{request_gpu, LimitsChoice, Pool, PoolOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gpu = request_gpu(LimitsChoice::Adapter)?;
//! let pool = Pool::new(&gpu, PoolOptions::default())?;
//! let context = Context::new(&pool, ContextOptions::default())?;
//! let weights = Gpt2Weights::random(&Gpt2Config::tiny(), 7)?;
//! let model = Gpt2::upload(&context, &weights, DType::F32)?;
//! let options = ServerOptions { budget_bytes: Some(64 << 20), ..ServerOptions::default() };
//! let mut server = Server::new(&context, model, options)?;
//! println!("sequences of 100 tokens that fit: {}", server.capacity_for(100));
//! server.submit(&RequestSpec { prompt: vec![1, 2, 3], max_new_tokens: 8 })?;
//! for done in server.run()? {
//!     println!("{:?} -> {:?}", done.prompt, done.output);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Files
//!
//! - `error.rs`: [`ServeError`].
//! - `kv.rs`: [`KvCache`].
//! - `model.rs`: [`Gpt2`], [`Head`], [`StepTensors`].
//! - `options.rs`: [`ServerOptions`], [`Execution`].
//! - `server.rs`: [`Server`].
//! - `sizing.rs`: [`MemoryPlan`], the dry run: the steps' activations and the KV cache a
//!   budget leaves room for, known before anything is made.
//! - `stats.rs`: [`Completion`], [`ServerStats`].
//! - `step.rs`: the plan of one step.

mod error;
mod kv;
mod model;
mod options;
mod server;
mod sizing;
mod stats;
mod step;

pub use error::ServeError;
pub use kv::KvCache;
pub use model::{Gpt2, Head, StepKind, StepTensors};
pub use options::{Execution, ServerOptions};
pub use server::Server;
pub use sizing::MemoryPlan;
pub use stats::{Completion, ServerStats};

// A stand-alone model of inductor's fp32 micro-GEMM (AVX-512, 48-column panels packed [N/48][K][48], K sliced by 204,
// both threads splitting N) over 120 products of 576 x 1536 (425 MB), with an optional software prefetch of the weights
// PF k-rows ahead (PF > 0: prefetcht0 into L1, PF < 0: prefetcht1 into L2). Configurations are timed in shuffled
// interleaved rounds (medians). Build and run (session 44, the Intel AMX kind):
//   g++ -O3 -march=native -fopenmp stream_gemm.cpp -o stream_gemm
//   OMP_NUM_THREADS=2 ./stream_gemm ROUNDS M MR KC PF [M MR KC PF ...]
// standalone: 120 products of 576x1536 fp32 packed [N/48][K][48], m rows, 2 threads split N
#include <immintrin.h>
#include <omp.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <chrono>
#include <cstring>
constexpr int K=576, N=1536, NR=48, NB=N/NR, P=120;
static int PF = 0; static int HINT=0;   // prefetch distance in k rows (0 off)
template<int ROWS>
static inline void kern(const float* A, int lda, const float* B, float* C, int ldc, int k0, int k1, bool acc){
  __m512 c[ROWS][3];
  for(int r=0;r<ROWS;r++) for(int j=0;j<3;j++) c[r][j]= acc? _mm512_loadu_ps(C+r*ldc+16*j) : _mm512_setzero_ps();
  for(int k=k0;k<k1;k++){
    const float* b=B+k*NR;
    if (PF>0) { _mm_prefetch((const char*)(b+PF*NR),_MM_HINT_T0); _mm_prefetch((const char*)(b+PF*NR+16),_MM_HINT_T0); _mm_prefetch((const char*)(b+PF*NR+32),_MM_HINT_T0);}
    else if (PF<0) { _mm_prefetch((const char*)(b-PF*NR),_MM_HINT_T1); _mm_prefetch((const char*)(b-PF*NR+16),_MM_HINT_T1); _mm_prefetch((const char*)(b-PF*NR+32),_MM_HINT_T1);}
    __m512 b0=_mm512_loadu_ps(b), b1=_mm512_loadu_ps(b+16), b2=_mm512_loadu_ps(b+32);
    for(int r=0;r<ROWS;r++){ __m512 a=_mm512_set1_ps(A[r*lda+k]); c[r][0]=_mm512_fmadd_ps(a,b0,c[r][0]); c[r][1]=_mm512_fmadd_ps(a,b1,c[r][1]); c[r][2]=_mm512_fmadd_ps(a,b2,c[r][2]);}
  }
  for(int r=0;r<ROWS;r++) for(int j=0;j<3;j++) _mm512_storeu_ps(C+r*ldc+16*j,c[r][j]);
}
template<int MR>
static void product(const float* X, int M, const float* W, float* Y, int KC){
  #pragma omp parallel for schedule(static)
  for(int nb=0;nb<NB;nb++){
    const float* Bp=W+(size_t)nb*K*NR;
    for(int k0=0;k0<K;k0+=KC){ int k1=std::min(K,k0+KC);
      int m=0;
      for(;m+MR<=M;m+=MR) kern<MR>(X+m*K,K,Bp,Y+m*N+nb*NR,N,k0,k1,k0>0);
      for(;m<M;m++) kern<1>(X+m*K,K,Bp,Y+m*N+nb*NR,N,k0,k1,k0>0);
    }
  }
}

struct Cfg{int M,MR,KC,PF;};
int main(int argc,char**argv){
  std::vector<Cfg> cf; int rounds=atoi(argv[1]);
  for(int i=2;i+3<argc;i+=4) cf.push_back({atoi(argv[i]),atoi(argv[i+1]),atoi(argv[i+2]),atoi(argv[i+3])});
  std::vector<float*> W(P); for(int p=0;p<P;p++){W[p]=(float*)aligned_alloc(64,(size_t)K*N*4); for(size_t i=0;i<(size_t)K*N;i++) W[p][i]=(float)((i*7+p)%13)*0.01f;}
  std::vector<float> X(8*K,0.5f), Y(8*N);
  std::vector<std::vector<double>> t(cf.size());
  std::vector<int> order(cf.size()); for(size_t i=0;i<cf.size();i++) order[i]=i;
  srand(1);
  for(int r=0;r<rounds;r++){ std::random_shuffle(order.begin(),order.end());
   for(int ci: order){ Cfg c=cf[ci]; PF=c.PF; auto s=std::chrono::steady_clock::now();
    for(int p=0;p<P;p++){ switch(c.MR){case 1: product<1>(X.data(),c.M,W[p],Y.data(),c.KC);break; case 2: product<2>(X.data(),c.M,W[p],Y.data(),c.KC);break; case 4: product<4>(X.data(),c.M,W[p],Y.data(),c.KC);break; case 8: product<8>(X.data(),c.M,W[p],Y.data(),c.KC);break;} }
    t[ci].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now()-s).count()*1e3);}}
  for(size_t i=0;i<cf.size();i++){ auto v=t[i]; std::sort(v.begin(),v.end()); printf("M=%d MR=%d KC=%d PF=%2d median %.2f ms\n",cf[i].M,cf[i].MR,cf[i].KC,cf[i].PF,v[v.size()/2]);}
}
